// MoE execution-regime catalog: the expert-kernel shapes training admitted, compressed to
// the smallest set of representatives that covers them (scout-paper-summary, "coverage-based
// compression").
//
// A shape is a kernel configuration (`fingerprint`: an opaque name the caller builds from
// layer, dtype, sizes) and a path-count vector (`paths`: tokens on each route through the
// kernel). Shape a covers shape b when their fingerprints match, they have as many paths,
// and a's count is no smaller on any path. The smallest covering set is exactly the
// non-dominated shapes of each fingerprint (a skyline): a dominated shape is covered by a
// shape that dominates it, and a non-dominated one only by itself.
//
// Pure functions, and Catalog, which owns its shapes; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace lmr::moe {

struct Shape {
  std::string fingerprint;
  std::vector<std::int64_t> paths;
  bool operator==(const Shape&) const = default;
  auto operator<=>(const Shape&) const = default;
};

bool covers(const Shape& a, const Shape& b) noexcept;

// The non-dominated shapes, duplicates removed, sorted by (fingerprint, paths) so every
// process lists them alike. Sort-filter-skyline per (fingerprint, path count): shapes sorted
// by path sum, largest first, so a dominator always precedes what it dominates; a shape is
// kept when no kept shape covers it. O(n log n + n r) for r representatives. InvalidArgument
// for an empty fingerprint or a negative count (naming the shape's index).
std::vector<Shape> skyline(std::vector<Shape> shapes);
// Every pair compared: the reference for tests and the benchmark's baseline. O(n^2).
std::vector<Shape> skylineNaive(const std::vector<Shape>& shapes);

class Catalog {
 public:
  // `remember`: how many distinct shapes are kept for deduplication and coverage validation
  // (a long run admits shapes at every step). Beyond it a shape still updates the
  // representatives but is not kept, so a repeat of a shape that was not kept counts again.
  explicit Catalog(std::size_t remember = std::numeric_limits<std::size_t>::max()) : remember_(remember) {}
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // Admits a shape; true when it was not admitted before. The representatives are kept
  // incrementally: a shape no representative covers joins them and evicts those it covers.
  // InvalidArgument (as skyline) leaves the catalog unchanged.
  bool admit(const Shape& shape);
  std::size_t admitted() const { return count_; }
  std::size_t remembered() const { return admitted_.size(); }
  // Sorted as skyline() sorts.
  std::vector<Shape> representatives() const;
  std::size_t representativeCount() const { return reps_.size(); }
  // 1 - representatives / admitted; 0 when nothing was admitted.
  double compression() const;
  // The first remembered shape (in sorted order) no representative covers; nullopt when the
  // representatives cover the catalog, as they must.
  std::optional<Shape> uncovered() const;
  // Approximate bytes held.
  std::size_t memoryBytes() const;

  // Replay in rotation. The `check`-th replay of the catalog takes, for each fingerprint,
  // the rotation() window of `per_check` of its representatives (all of them when
  // per_check <= 0), sorted as representatives().
  std::vector<Shape> window(std::int64_t check, std::int64_t per_check) const;
  // Shapes replayed by an accepted check since the cycle began.
  void replayed(const std::vector<Shape>& shapes);
  // Whether every current representative was replayed since the cycle began (a
  // representative that a newly admitted shape evicted has to be replaced by that shape's
  // replay); an empty catalog is never complete.
  bool cycleComplete() const;
  void startCycle() { replayed_.clear(); }

 private:
  struct Hash {
    std::size_t operator()(const Shape& s) const noexcept;
  };
  std::unordered_set<Shape, Hash> admitted_;
  std::vector<Shape> reps_;
  std::size_t remember_ = std::numeric_limits<std::size_t>::max();
  std::size_t count_ = 0;
  std::unordered_set<Shape, Hash> replayed_;
};

// The execution regime of a token count: `tokens` rounded up to the next of four steps per
// doubling (..., 64, 80, 96, 112, 128, 160, ...: a count at most 25% larger), and to a
// multiple of `granularity` where that step is finer. 0 stays 0. Shapes admitted at regime
// counts compress far better (counts a few tokens apart run the same kernels alike), and a
// replay at the regime count runs at least the tokens of every count it stands for.
// InvalidArgument for a negative count or a granularity below 1.
std::int64_t regimeTokens(std::int64_t tokens, std::int64_t granularity);

// Which representatives the `check`-th check replays: `per_check` consecutive indices of
// `count`, rotating (check n starts at n * per_check mod count); every index when per_check
// <= 0 or >= count; none when count is 0.
std::vector<std::size_t> rotation(std::int64_t check, std::size_t count, std::int64_t per_check);

}  // namespace lmr::moe
