// The per-block bijection behind tensor signatures, shared by the CPU and CUDA code.
// Changing anything here changes every signature: keep CPU, CUDA and the torch reference
// (bench/torch_signature.py) in step, and the golden values in the tests will say so.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LMR_HD __host__ __device__ __forceinline__
#else
#define LMR_HD inline
#endif

namespace lmr::signature::detail {

struct Quad {
  std::uint32_t x0, x1, x2, x3;
};

// Position keys (odd, so lo * key is a bijection of lo), first multipliers (odd),
// and the final avalanche multipliers (those of murmur3's fmix32).
inline constexpr std::uint32_t kKeyLo0 = 0x9E3779B1u, kKeyLo1 = 0x85EBCA77u, kKeyLo2 = 0xC2B2AE3Du,
                               kKeyLo3 = 0x27D4EB2Fu;
inline constexpr std::uint32_t kKeyHi0 = 0x165667B1u, kKeyHi1 = 0xD3A2646Du, kKeyHi2 = 0xFD7046C5u,
                               kKeyHi3 = 0xB55A4F09u;
inline constexpr std::uint32_t kMul0 = 0x7FEB352Du, kMul1 = 0x846CA68Bu, kMul2 = 0xCC9E2D51u, kMul3 = 0x1B873593u;
inline constexpr std::uint32_t kFmixA = 0x85EBCA6Bu, kFmixB = 0xC2B2AE35u;

// Block indices at the top of the 64-bit range are reserved for finalisation; no tensor
// has 2^64 - 4 blocks.
inline constexpr std::uint64_t kFinalContentA = ~0ull, kFinalContentB = ~0ull - 1;
inline constexpr std::uint64_t kFinalCombineA = ~0ull - 2, kFinalCombineB = ~0ull - 3;

LMR_HD std::uint32_t fmix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= kFmixA;
  x ^= x >> 13;
  x *= kFmixB;
  x ^= x >> 16;
  return x;
}

// Bijection of the four words w for every block index. Each step is invertible:
// xor with a key, multiply by an odd constant, x ^= x >> s, and the chain of additions.
LMR_HD Quad mixBlock(Quad w, std::uint64_t block) {
  const std::uint32_t lo = static_cast<std::uint32_t>(block);
  const std::uint32_t hi = static_cast<std::uint32_t>(block >> 32);
  std::uint32_t x0 = (w.x0 ^ (lo * kKeyLo0 + hi * kKeyHi0)) * kMul0;
  std::uint32_t x1 = (w.x1 ^ (lo * kKeyLo1 + hi * kKeyHi1)) * kMul1;
  std::uint32_t x2 = (w.x2 ^ (lo * kKeyLo2 + hi * kKeyHi2)) * kMul2;
  std::uint32_t x3 = (w.x3 ^ (lo * kKeyLo3 + hi * kKeyHi3)) * kMul3;
  x0 ^= x0 >> 15;
  x1 ^= x1 >> 15;
  x2 ^= x2 >> 15;
  x3 ^= x3 >> 15;
  x1 += x0;
  x2 += x1;
  x3 += x2;
  x0 += x3;
  return Quad{fmix32(x0), fmix32(x1), fmix32(x2), fmix32(x3)};
}

LMR_HD void addInto(Quad& acc, const Quad& v) {
  acc.x0 += v.x0;
  acc.x1 += v.x1;
  acc.x2 += v.x2;
  acc.x3 += v.x3;
}

}  // namespace lmr::signature::detail
