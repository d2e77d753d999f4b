#include <algorithm>
#include <limits>

#include "lmr/campaign/manifest.h"

namespace lmr::campaign {

std::uint64_t Trigger::candidateCount() const {
  if (!is_range) return at.size();
  return static_cast<std::uint64_t>((end - start) / every) + 1;
}

std::int64_t Trigger::firstCandidate() const { return is_range ? start : at.front(); }

std::int64_t Trigger::lastCandidate() const { return is_range ? start + (end - start) / every * every : at.back(); }

std::optional<std::int64_t> Trigger::firstAtOrAfter(std::int64_t x) const {
  if (!is_range) {
    auto it = std::lower_bound(at.begin(), at.end(), x);
    if (it == at.end()) return std::nullopt;
    return *it;
  }
  if (x <= start) return start;
  const std::int64_t last = lastCandidate();
  if (x > last) return std::nullopt;
  // In 128 bits: x - start + every - 1 can exceed int64 near the top of the range.
  const __int128 steps = (static_cast<__int128>(x) - start + every - 1) / every;
  return static_cast<std::int64_t>(start + steps * every);
}

bool Trigger::isCandidate(std::int64_t x) const {
  if (!is_range) return std::binary_search(at.begin(), at.end(), x);
  return x >= start && x <= lastCandidate() && (x - start) % every == 0;
}

std::optional<std::int64_t> Trigger::minSpacing() const {
  if (candidateCount() < 2) return std::nullopt;
  if (is_range) return every;
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  for (std::size_t i = 1; i < at.size(); ++i) best = std::min(best, at[i] - at[i - 1]);
  return best;
}

std::optional<std::int64_t> Lifetime::windowIterations() const {
  switch (kind) {
    case LifetimeKind::kIterations: return count;
    case LifetimeKind::kMatchingCalls: return count == 1 ? std::optional<std::int64_t>(1) : std::nullopt;
    case LifetimeKind::kUntil: return std::nullopt;
  }
  return std::nullopt;
}

std::optional<std::int64_t> Lifetime::lastActiveIteration(std::int64_t first) const {
  if (auto n = windowIterations()) return first + *n - 1;
  return std::nullopt;
}

std::optional<std::int64_t> Target::expectedRank() const {
  if (rank) return rank;
  if (resource || host) return std::nullopt;
  return 0;
}

TemporalClass Incident::temporalClass() const {
  if (lifetime.kind == LifetimeKind::kUntil) return TemporalClass::kPermanent;
  if (trigger.candidateCount() == 1 && trigger.probability >= 1.0) return TemporalClass::kTransient;
  return TemporalClass::kIntermittent;
}

}  // namespace lmr::campaign
