// Built-in tensor corruption: which elements an injection touches, and what it does to
// them, on host buffers of float16, bfloat16, float32 or float64 (the caller moves device
// tensors to the host and back).
//
// Everything random is a pure function of (campaign seed, injection id): the selection of
// elements, the bit flipped, the noise drawn. Element i is selected by a keyed hash of i,
// so any element's membership can be recomputed without storing the selection.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/common/keyed_hash.h"

namespace lmr::inject {

enum class Dtype : std::uint8_t { kFloat16, kBFloat16, kFloat32, kFloat64 };
enum class Scope : std::uint8_t { kSingle, kRow, kOnePercent, kTenPercent, kAll };
enum class Operation : std::uint8_t { kSingleBitflip, kMultiBitflip, kSetValue, kScale, kNoise, kSignFlip };
enum class Magnitude : std::uint8_t { kCatastrophic, kLarge, kMedium, kSubtle, kNearInvisible };

// Wire names as in manifests ("float16" ... / "single", "row", "1%", ... / operations /
// magnitudes). Parsers throw InvalidArgument naming the unknown value.
Dtype parseDtype(std::string_view s);
Scope parseScope(std::string_view s);
Operation parseOperation(std::string_view s);
Magnitude parseMagnitude(std::string_view s);
std::size_t dtypeSize(Dtype d) noexcept;

// The elements one injection selects, among `numel` elements laid out as `rows` rows of
// numel / rows elements (rows = the leading dimension; 1 for scalars and vectors).
class Selection {
 public:
  Selection(Int128 seed, std::string_view injection_id, Scope scope, std::int64_t numel, std::int64_t rows);

  // single: one element; row: every element of one row; 1% / 10%: each element with that
  // probability, plus always one anchor element so that at least one is chosen; all: all.
  bool contains(std::int64_t index) const;
  std::vector<std::int64_t> indices() const;  // in increasing order
  std::int64_t anchor() const { return anchor_; }
  std::int64_t row() const { return row_; }
  std::uint64_t stream() const { return stream_; }  // seed of per-element randomness

 private:
  Scope scope_;
  std::int64_t numel_, row_len_;
  std::uint64_t stream_;
  std::uint64_t threshold_ = 0;  // percentage scopes: selected when hash < threshold
  std::int64_t anchor_ = 0, row_ = 0;
};

struct Spec {
  Operation operation = Operation::kSignFlip;
  Magnitude magnitude = Magnitude::kMedium;
  std::optional<double> value;   // set_value (NaN and infinities allowed)
  std::optional<double> factor;  // scale; default from magnitude
  std::optional<double> stddev;  // noise; default from magnitude
};

// The bit(s) a bit flip of `magnitude` flips in `dtype`, most significant first.
std::vector<int> flippedBits(Dtype dtype, Operation op, Magnitude magnitude);
double defaultFactor(Magnitude m) noexcept;
double defaultStddev(Magnitude m) noexcept;

// What an applied corruption did, and what retiring it needs.
struct Applied {
  std::vector<std::int64_t> indices;   // selected elements, increasing
  std::vector<std::uint64_t> original;  // their bits before
  std::vector<std::uint64_t> injected;  // their bits after
  std::int64_t changed = 0;             // elements whose bits differ
};

// Applies `spec` in place to the selected elements of `data` (numel elements of `dtype`).
// Throws InvalidArgument, leaving `data` untouched, when a finite set_value does not fit
// the dtype. Thread-compatible: callers serialise access to `data`.
Applied corrupt(void* data, Dtype dtype, std::int64_t numel, const Selection& selection, const Spec& spec);

// Writes `values` (count = indices.size() elements of `dtype`, in index order) over the
// elements `indices` of `data`: stale and duplicated state. Returns what retire() needs.
Applied overwrite(void* data, Dtype dtype, std::int64_t numel, const std::vector<std::int64_t>& indices,
                  const void* values);

// Removes an applied corruption from a buffer training may have changed since: an element
// still holding its injected bits gets its original bits back exactly; any other element
// has the injected delta (injected - original, in float64) subtracted, so updates made
// meanwhile survive. Returns how many elements were restored exactly. Throws
// InvalidArgument, leaving the buffer untouched, when the delta is not finite (a non-finite
// injection cannot be retired) or `applied` does not fit a buffer of `numel` elements (an
// index outside it, or record lists of different lengths: applied to another tensor).
std::int64_t retire(void* data, Dtype dtype, std::int64_t numel, const Applied& applied);

// reorder: rotates `rows` rows of `row_bytes` bytes each by one (row i takes the bytes row
// i - 1 held, row 0 those of the last row), as a batch delivered out of order. Any dtype.
// Returns how many rows now hold different bytes. Throws InvalidArgument for fewer than two
// rows.
std::int64_t reorderRows(void* data, std::int64_t rows, std::size_t row_bytes);

// Element i of the buffer as float64 (tests and evidence).
double loadAsDouble(const void* data, Dtype dtype, std::int64_t index);

}  // namespace lmr::inject
