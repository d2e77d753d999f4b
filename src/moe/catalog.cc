#include "lmr/moe/catalog.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "lmr/common/error.h"

namespace lmr::moe {
namespace {

void validate(const Shape& s, std::size_t index) {
  if (s.fingerprint.empty()) throw InvalidArgument("shape " + std::to_string(index) + " has an empty fingerprint");
  for (std::size_t i = 0; i < s.paths.size(); ++i) {
    if (s.paths[i] < 0)
      throw InvalidArgument("shape " + std::to_string(index) + " (" + s.fingerprint + ") has a negative count " +
                            std::to_string(s.paths[i]) + " on path " + std::to_string(i));
  }
}

std::int64_t sum(const Shape& s) { return std::accumulate(s.paths.begin(), s.paths.end(), std::int64_t{0}); }

}  // namespace

bool covers(const Shape& a, const Shape& b) noexcept {
  if (a.fingerprint != b.fingerprint || a.paths.size() != b.paths.size()) return false;
  for (std::size_t i = 0; i < a.paths.size(); ++i)
    if (a.paths[i] < b.paths[i]) return false;
  return true;
}

std::vector<Shape> skyline(std::vector<Shape> shapes) {
  for (std::size_t i = 0; i < shapes.size(); ++i) validate(shapes[i], i);
  // Group by (fingerprint, path count); within a group, largest path sum first (ties by
  // paths, descending): anything that covers a shape has a sum at least as large and, at an
  // equal sum, is the same shape.
  std::vector<std::pair<std::int64_t, std::size_t>> order;
  order.reserve(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) order.emplace_back(sum(shapes[i]), i);
  std::sort(order.begin(), order.end(), [&](const auto& x, const auto& y) {
    const Shape& a = shapes[x.second];
    const Shape& b = shapes[y.second];
    if (a.fingerprint != b.fingerprint) return a.fingerprint < b.fingerprint;
    if (a.paths.size() != b.paths.size()) return a.paths.size() < b.paths.size();
    if (x.first != y.first) return x.first > y.first;
    return a.paths > b.paths;
  });
  std::vector<Shape> out;
  std::size_t group_start = 0;  // first kept shape of the current group in `out`
  for (std::size_t k = 0; k < order.size(); ++k) {
    Shape& s = shapes[order[k].second];
    if (!out.empty() && (out.back().fingerprint != s.fingerprint || out.back().paths.size() != s.paths.size()))
      group_start = out.size();
    bool covered = false;
    for (std::size_t r = group_start; r < out.size() && !covered; ++r) covered = covers(out[r], s);
    if (!covered) out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Shape> skylineNaive(const std::vector<Shape>& shapes) {
  for (std::size_t i = 0; i < shapes.size(); ++i) validate(shapes[i], i);
  std::vector<Shape> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    bool dominated = false;
    for (std::size_t j = 0; j < shapes.size() && !dominated; ++j)
      dominated = j != i && covers(shapes[j], shapes[i]) && !(shapes[j] == shapes[i]);
    if (!dominated) out.push_back(shapes[i]);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::size_t Catalog::Hash::operator()(const Shape& s) const noexcept {
  std::size_t h = std::hash<std::string>{}(s.fingerprint);
  for (std::int64_t c : s.paths) h ^= std::hash<std::int64_t>{}(c) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

bool Catalog::admit(const Shape& shape) {
  validate(shape, count_);
  if (admitted_.count(shape) || std::find(reps_.begin(), reps_.end(), shape) != reps_.end()) return false;
  if (admitted_.size() < remember_) admitted_.insert(shape);
  ++count_;
  for (const Shape& r : reps_)
    if (covers(r, shape)) return true;
  std::erase_if(reps_, [&](const Shape& r) { return covers(shape, r); });
  reps_.push_back(shape);
  return true;
}

std::vector<Shape> Catalog::representatives() const {
  std::vector<Shape> out = reps_;
  std::sort(out.begin(), out.end());
  return out;
}

double Catalog::compression() const {
  if (count_ == 0) return 0.0;
  return 1.0 - static_cast<double>(reps_.size()) / static_cast<double>(count_);
}

std::optional<Shape> Catalog::uncovered() const {
  std::vector<Shape> all(admitted_.begin(), admitted_.end());
  std::sort(all.begin(), all.end());
  for (const Shape& s : all) {
    const bool ok = std::any_of(reps_.begin(), reps_.end(), [&](const Shape& r) { return covers(r, s); });
    if (!ok) return s;
  }
  return std::nullopt;
}

std::size_t Catalog::memoryBytes() const {
  auto bytes = [](const Shape& s) {
    return sizeof(Shape) + s.fingerprint.capacity() + s.paths.capacity() * sizeof(std::int64_t);
  };
  std::size_t total = admitted_.bucket_count() * sizeof(void*) + reps_.capacity() * sizeof(Shape);
  for (const Shape& s : admitted_) total += bytes(s) + 2 * sizeof(void*);
  for (const Shape& s : reps_) total += bytes(s) - sizeof(Shape);
  return total;
}

std::vector<Shape> Catalog::window(std::int64_t check, std::int64_t per_check) const {
  const std::vector<Shape> all = representatives();
  std::vector<Shape> out;
  for (std::size_t begin = 0; begin < all.size();) {
    std::size_t end = begin;
    while (end < all.size() && all[end].fingerprint == all[begin].fingerprint) ++end;
    for (std::size_t i : rotation(check, end - begin, per_check)) out.push_back(all[begin + i]);
    begin = end;
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Catalog::replayed(const std::vector<Shape>& shapes) {
  for (const Shape& s : shapes) replayed_.insert(s);
}

bool Catalog::cycleComplete() const {
  return !reps_.empty() &&
         std::all_of(reps_.begin(), reps_.end(), [&](const Shape& r) { return replayed_.count(r) > 0; });
}

std::int64_t regimeTokens(std::int64_t tokens, std::int64_t granularity) {
  if (tokens < 0) throw InvalidArgument("a token count must be >= 0, got " + std::to_string(tokens));
  if (granularity < 1) throw InvalidArgument("a token granularity must be >= 1, got " + std::to_string(granularity));
  if (tokens == 0) return 0;
  std::int64_t top = 1;  // the highest power of two <= tokens
  while (top <= tokens / 2) top *= 2;
  const std::int64_t step = std::max(granularity, top / 4);
  return (tokens + step - 1) / step * step;
}

std::vector<std::size_t> rotation(std::int64_t check, std::size_t count, std::int64_t per_check) {
  std::vector<std::size_t> out;
  if (count == 0) return out;
  if (per_check <= 0 || static_cast<std::size_t>(per_check) >= count) {
    out.resize(count);
    std::iota(out.begin(), out.end(), std::size_t{0});
    return out;
  }
  const auto n = static_cast<std::int64_t>(count);
  const std::int64_t start = ((check % n) * (per_check % n)) % n;
  const std::int64_t first = start < 0 ? start + n : start;
  for (std::int64_t i = 0; i < per_check; ++i) out.push_back(static_cast<std::size_t>((first + i) % n));
  return out;
}

}  // namespace lmr::moe
