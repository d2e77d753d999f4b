// Private: raw bits of the four floating dtypes, and conversions to and from double with
// round-to-nearest-even (float16 and bfloat16 have no native C++ type here).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "lmr/inject/corrupt.h"

namespace lmr::inject::detail {

inline std::uint64_t loadBits(const void* data, Dtype d, std::int64_t i) {
  const auto* p = static_cast<const unsigned char*>(data);
  switch (d) {
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      std::uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case Dtype::kFloat32: {
      std::uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case Dtype::kFloat64: {
      std::uint64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
  }
  return 0;
}

inline void storeBits(void* data, Dtype d, std::int64_t i, std::uint64_t bits) {
  auto* p = static_cast<unsigned char*>(data);
  switch (d) {
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      const auto v = static_cast<std::uint16_t>(bits);
      std::memcpy(p + 2 * i, &v, 2);
      break;
    }
    case Dtype::kFloat32: {
      const auto v = static_cast<std::uint32_t>(bits);
      std::memcpy(p + 4 * i, &v, 4);
      break;
    }
    case Dtype::kFloat64: std::memcpy(p + 8 * i, &bits, 8); break;
  }
}

inline double halfToDouble(std::uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  double v;
  if (exp == 0) v = std::ldexp(mant, -24);
  else if (exp == 31) v = mant ? std::nan("") : INFINITY;
  else v = std::ldexp(mant + 1024, exp - 25);
  return sign ? -v : v;
}

inline std::uint16_t doubleToHalf(double x) {
  // Through float32 first would double-round; do it directly.
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7E00;
  double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;  // rounds to infinity
  if (a < std::ldexp(1.0, -14)) {          // subnormal (or zero): units of 2^-24
    const double q = std::nearbyint(a * std::ldexp(1.0, 24));
    return sign | static_cast<std::uint16_t>(q);
  }
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  double q = std::nearbyint(m * 2048.0);  // 11 significant bits
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  const int biased = e - 1 + 15;
  return sign | static_cast<std::uint16_t>((biased << 10) | (static_cast<int>(q) - 1024));
}

inline double bf16ToDouble(std::uint16_t b) {
  const std::uint32_t f = static_cast<std::uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &f, 4);
  return v;
}

inline std::uint16_t doubleToBf16(double x) {
  const float f = static_cast<float>(x);  // exact for values already representable
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  // Round to nearest even on the dropped 16 bits. (A double that is not a float was
  // rounded once already; the corruption values this serves are not sensitive to it.)
  const std::uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

inline double bitsToDouble(std::uint64_t bits, Dtype d) {
  switch (d) {
    case Dtype::kFloat16: return halfToDouble(static_cast<std::uint16_t>(bits));
    case Dtype::kBFloat16: return bf16ToDouble(static_cast<std::uint16_t>(bits));
    case Dtype::kFloat32: {
      const auto u = static_cast<std::uint32_t>(bits);
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case Dtype::kFloat64: {
      double v;
      std::memcpy(&v, &bits, 8);
      return v;
    }
  }
  return 0;
}

inline std::uint64_t doubleToBits(double x, Dtype d) {
  switch (d) {
    case Dtype::kFloat16: return doubleToHalf(x);
    case Dtype::kBFloat16: return doubleToBf16(x);
    case Dtype::kFloat32: {
      const float f = static_cast<float>(x);
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }
    case Dtype::kFloat64: {
      std::uint64_t u;
      std::memcpy(&u, &x, 8);
      return u;
    }
  }
  return 0;
}

// Largest finite value of the dtype.
inline double maxFinite(Dtype d) {
  switch (d) {
    case Dtype::kFloat16: return 65504.0;
    case Dtype::kBFloat16: return 3.3895313892515355e38;
    case Dtype::kFloat32: return 3.4028234663852886e38;
    case Dtype::kFloat64: return 1.7976931348623157e308;
  }
  return 0;
}

}  // namespace lmr::inject::detail
