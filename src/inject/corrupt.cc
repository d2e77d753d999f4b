#include "lmr/inject/corrupt.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "float_bits.h"
#include "lmr/common/error.h"

namespace lmr::inject {
namespace {

using detail::bitsToDouble;
using detail::doubleToBits;
using detail::loadBits;
using detail::storeBits;

// splitmix64: the per-element randomness, seeded from the keyed hash.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t elementHash(std::uint64_t stream, std::int64_t index, std::uint64_t salt) {
  return mix(stream ^ mix(static_cast<std::uint64_t>(index) * 2 + salt));
}

double uniform01(std::uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)

struct Layout {
  int sign, exponent_top, exponent_low, mantissa_top;  // mantissa_low is 0
};

Layout layoutOf(Dtype d) {
  switch (d) {
    case Dtype::kFloat16: return {15, 14, 10, 9};
    case Dtype::kBFloat16: return {15, 14, 7, 6};
    case Dtype::kFloat32: return {31, 30, 23, 22};
    case Dtype::kFloat64: return {63, 62, 52, 51};
  }
  return {0, 0, 0, 0};
}

template <typename E, std::size_t N>
E lookup(std::string_view s, const std::pair<std::string_view, E> (&table)[N], const char* what) {
  for (const auto& [name, value] : table)
    if (name == s) return value;
  throw InvalidArgument(std::string("unknown ") + what + " \"" + std::string(s) + "\"");
}

}  // namespace

Dtype parseDtype(std::string_view s) {
  static const std::pair<std::string_view, Dtype> t[] = {{"float16", Dtype::kFloat16},
                                                         {"bfloat16", Dtype::kBFloat16},
                                                         {"float32", Dtype::kFloat32},
                                                         {"float64", Dtype::kFloat64}};
  return lookup(s, t, "dtype (bit-level effects support float16, bfloat16, float32, float64)");
}

Scope parseScope(std::string_view s) {
  static const std::pair<std::string_view, Scope> t[] = {{"single", Scope::kSingle},
                                                         {"row", Scope::kRow},
                                                         {"1%", Scope::kOnePercent},
                                                         {"10%", Scope::kTenPercent},
                                                         {"100%", Scope::kAll}};
  return lookup(s, t, "scope");
}

Operation parseOperation(std::string_view s) {
  static const std::pair<std::string_view, Operation> t[] = {{"single_bitflip", Operation::kSingleBitflip},
                                                             {"multi_bitflip", Operation::kMultiBitflip},
                                                             {"set_value", Operation::kSetValue},
                                                             {"scale", Operation::kScale},
                                                             {"noise", Operation::kNoise},
                                                             {"sign_flip", Operation::kSignFlip}};
  return lookup(s, t, "operation");
}

Magnitude parseMagnitude(std::string_view s) {
  static const std::pair<std::string_view, Magnitude> t[] = {{"catastrophic", Magnitude::kCatastrophic},
                                                             {"large", Magnitude::kLarge},
                                                             {"medium", Magnitude::kMedium},
                                                             {"subtle", Magnitude::kSubtle},
                                                             {"near_invisible", Magnitude::kNearInvisible}};
  return lookup(s, t, "magnitude");
}

std::size_t dtypeSize(Dtype d) noexcept {
  switch (d) {
    case Dtype::kFloat16:
    case Dtype::kBFloat16: return 2;
    case Dtype::kFloat32: return 4;
    case Dtype::kFloat64: return 8;
  }
  return 0;
}

Selection::Selection(Int128 seed, std::string_view injection_id, Scope scope, std::int64_t numel, std::int64_t rows)
    : scope_(scope), numel_(numel) {
  if (numel <= 0) throw InvalidArgument("nothing to select in an empty tensor");
  if (rows <= 0 || numel % rows != 0) throw InvalidArgument("rows must divide the element count");
  row_len_ = numel / rows;
  stream_ = keyedHash(seed, "inject.select", {injection_id}, 0);
  anchor_ = static_cast<std::int64_t>(mix(stream_) % static_cast<std::uint64_t>(numel));
  row_ = static_cast<std::int64_t>(mix(stream_ ^ 0x5bd1e995ull) % static_cast<std::uint64_t>(rows));
  if (scope == Scope::kOnePercent) threshold_ = 0xFFFFFFFFFFFFFFFFull / 100;
  if (scope == Scope::kTenPercent) threshold_ = 0xFFFFFFFFFFFFFFFFull / 10;
}

bool Selection::contains(std::int64_t i) const {
  if (i < 0 || i >= numel_) return false;
  switch (scope_) {
    case Scope::kSingle: return i == anchor_;
    case Scope::kRow: return i / row_len_ == row_;
    case Scope::kOnePercent:
    case Scope::kTenPercent: return i == anchor_ || elementHash(stream_, i, 1) < threshold_;
    case Scope::kAll: return true;
  }
  return false;
}

std::vector<std::int64_t> Selection::indices() const {
  std::vector<std::int64_t> out;
  switch (scope_) {
    case Scope::kSingle: out.push_back(anchor_); break;
    case Scope::kRow:
      for (std::int64_t i = row_ * row_len_; i < (row_ + 1) * row_len_; ++i) out.push_back(i);
      break;
    default:
      for (std::int64_t i = 0; i < numel_; ++i)
        if (contains(i)) out.push_back(i);
  }
  return out;
}

std::vector<int> flippedBits(Dtype dtype, Operation op, Magnitude magnitude) {
  const Layout l = layoutOf(dtype);
  int bit = 0;
  switch (magnitude) {
    case Magnitude::kCatastrophic: bit = l.exponent_top; break;   // x 2^(+-2^(e-1)): inf, huge or ~0
    case Magnitude::kLarge: bit = l.exponent_low; break;          // x 2 or / 2
    case Magnitude::kMedium: bit = l.mantissa_top; break;         // about +-25..50%
    case Magnitude::kSubtle: bit = (l.mantissa_top + 1) / 2; break;  // middle of the mantissa
    case Magnitude::kNearInvisible: bit = 0; break;               // one unit in the last place
  }
  if (op == Operation::kSingleBitflip) return {bit};
  // multi_bitflip: three adjacent bits of the same field, from `bit` downwards when there
  // is room, otherwise upwards.
  const int field_low = bit >= l.exponent_low ? l.exponent_low : 0;
  if (bit - 2 >= field_low) return {bit, bit - 1, bit - 2};
  return {bit + 2, bit + 1, bit};
}

double defaultFactor(Magnitude m) noexcept {
  switch (m) {
    case Magnitude::kCatastrophic: return 1e6;
    case Magnitude::kLarge: return 100.0;
    case Magnitude::kMedium: return 2.0;
    case Magnitude::kSubtle: return 1.05;
    case Magnitude::kNearInvisible: return 1.0001;
  }
  return 2.0;
}

double defaultStddev(Magnitude m) noexcept {
  switch (m) {
    case Magnitude::kCatastrophic: return 1e3;
    case Magnitude::kLarge: return 1.0;
    case Magnitude::kMedium: return 0.1;
    case Magnitude::kSubtle: return 1e-3;
    case Magnitude::kNearInvisible: return 1e-6;
  }
  return 0.1;
}

Applied corrupt(void* data, Dtype dtype, std::int64_t numel, const Selection& selection, const Spec& spec) {
  if (data == nullptr || numel <= 0) throw InvalidArgument("corrupt: empty buffer");
  if (spec.operation == Operation::kSetValue) {
    if (!spec.value) throw InvalidArgument("set_value needs a value");
    if (std::isfinite(*spec.value) && std::fabs(*spec.value) > detail::maxFinite(dtype)) {
      throw InvalidArgument("set_value " + std::to_string(*spec.value) + " does not fit the tensor's dtype");
    }
  }
  const Layout l = layoutOf(dtype);
  std::uint64_t flip_mask = 0;
  if (spec.operation == Operation::kSingleBitflip || spec.operation == Operation::kMultiBitflip) {
    for (int b : flippedBits(dtype, spec.operation, spec.magnitude)) flip_mask |= std::uint64_t{1} << b;
  }
  const double factor = spec.factor.value_or(defaultFactor(spec.magnitude));
  const double stddev = spec.stddev.value_or(defaultStddev(spec.magnitude));

  Applied out;
  out.indices = selection.indices();
  out.original.reserve(out.indices.size());
  out.injected.reserve(out.indices.size());
  for (std::int64_t i : out.indices) {
    const std::uint64_t before = loadBits(data, dtype, i);
    std::uint64_t after = before;
    switch (spec.operation) {
      case Operation::kSingleBitflip:
      case Operation::kMultiBitflip: after = before ^ flip_mask; break;
      case Operation::kSignFlip: after = before ^ (std::uint64_t{1} << l.sign); break;
      case Operation::kSetValue: after = doubleToBits(*spec.value, dtype); break;
      case Operation::kScale: after = doubleToBits(bitsToDouble(before, dtype) * factor, dtype); break;
      case Operation::kNoise: {
        // Box-Muller from two element-keyed uniforms.
        const double u1 = uniform01(elementHash(selection.stream(), i, 2));
        const double u2 = uniform01(elementHash(selection.stream(), i, 3));
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        after = doubleToBits(bitsToDouble(before, dtype) + stddev * z, dtype);
        break;
      }
    }
    storeBits(data, dtype, i, after);
    out.original.push_back(before);
    out.injected.push_back(after);
    out.changed += before != after ? 1 : 0;
  }
  return out;
}

Applied overwrite(void* data, Dtype dtype, std::int64_t numel, const std::vector<std::int64_t>& indices,
                  const void* values) {
  if (data == nullptr || numel <= 0) throw InvalidArgument("overwrite: empty buffer");
  for (std::int64_t i : indices)
    if (i < 0 || i >= numel) throw InvalidArgument("overwrite: index " + std::to_string(i) + " outside the tensor");
  Applied out;
  out.indices = indices;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::uint64_t before = loadBits(data, dtype, indices[k]);
    const std::uint64_t after = loadBits(values, dtype, static_cast<std::int64_t>(k));
    storeBits(data, dtype, indices[k], after);
    out.original.push_back(before);
    out.injected.push_back(after);
    out.changed += before != after ? 1 : 0;
  }
  return out;
}

namespace {

// Whether an element still holds what was injected: the same bits, or NaN where NaN was
// injected (arithmetic on NaN need not keep its payload or sign).
bool stillInjected(std::uint64_t now, std::uint64_t injected, Dtype dtype) {
  return now == injected || (std::isnan(bitsToDouble(now, dtype)) && std::isnan(bitsToDouble(injected, dtype)));
}

}  // namespace

std::int64_t retire(void* data, Dtype dtype, std::int64_t numel, const Applied& applied) {
  if (applied.original.size() != applied.indices.size() || applied.injected.size() != applied.indices.size()) {
    throw InvalidArgument("retire: the record holds " + std::to_string(applied.indices.size()) + " indices, " +
                          std::to_string(applied.original.size()) + " original and " +
                          std::to_string(applied.injected.size()) + " injected values");
  }
  for (std::int64_t i : applied.indices) {
    if (i < 0 || i >= numel) {
      throw InvalidArgument("retire: index " + std::to_string(i) + " outside the tensor's " + std::to_string(numel) +
                            " elements (the corruption was applied to another tensor)");
    }
  }
  if (!applied.indices.empty() && data == nullptr) throw InvalidArgument("retire: empty buffer");
  // Check every delta first, so a refusal leaves the buffer untouched.
  std::vector<double> deltas(applied.indices.size());
  for (std::size_t k = 0; k < applied.indices.size(); ++k) {
    if (stillInjected(loadBits(data, dtype, applied.indices[k]), applied.injected[k], dtype)) continue;
    deltas[k] = bitsToDouble(applied.injected[k], dtype) - bitsToDouble(applied.original[k], dtype);
    if (!std::isfinite(deltas[k])) {
      throw InvalidArgument("the injected change of element " + std::to_string(applied.indices[k]) +
                            " is not finite and cannot be subtracted");
    }
  }
  std::int64_t exact = 0;
  for (std::size_t k = 0; k < applied.indices.size(); ++k) {
    const std::int64_t i = applied.indices[k];
    const std::uint64_t now = loadBits(data, dtype, i);
    if (stillInjected(now, applied.injected[k], dtype)) {
      storeBits(data, dtype, i, applied.original[k]);
      ++exact;
    } else {
      storeBits(data, dtype, i, doubleToBits(bitsToDouble(now, dtype) - deltas[k], dtype));
    }
  }
  return exact;
}

std::int64_t reorderRows(void* data, std::int64_t rows, std::size_t row_bytes) {
  if (rows < 2) throw InvalidArgument("reorder needs a leading dimension of at least 2");
  auto* bytes = static_cast<unsigned char*>(data);
  const std::size_t n = static_cast<std::size_t>(rows);
  std::vector<unsigned char> last(bytes + (n - 1) * row_bytes, bytes + n * row_bytes);
  std::memmove(bytes + row_bytes, bytes, (n - 1) * row_bytes);
  std::memcpy(bytes, last.data(), row_bytes);
  std::int64_t changed = 0;
  for (std::size_t i = 0; i < n; ++i) {  // row i held what row i + 1 holds now (the last: `last`)
    const unsigned char* now = bytes + i * row_bytes;
    const unsigned char* was = i + 1 < n ? bytes + (i + 1) * row_bytes : last.data();
    changed += std::memcmp(now, was, row_bytes) != 0;
  }
  return changed;
}

double loadAsDouble(const void* data, Dtype dtype, std::int64_t index) {
  return bitsToDouble(loadBits(data, dtype, index), dtype);
}

}  // namespace lmr::inject
