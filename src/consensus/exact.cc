#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>

#include "lmr/common/error.h"
#include "lmr/consensus/consensus.h"
#include "peer_ranks.h"

namespace lmr::consensus {
namespace detail {

std::vector<std::int64_t> checkedPeerRanks(std::span<const std::int64_t> given, std::size_t n) {
  std::vector<std::int64_t> ranks;
  if (given.empty()) {
    for (std::size_t i = 0; i < n; ++i) ranks.push_back(static_cast<std::int64_t>(i));
    return ranks;
  }
  if (given.size() != n) {
    throw InvalidArgument("peer_ranks has " + std::to_string(given.size()) + " entries for " + std::to_string(n) +
                          " peers");
  }
  ranks.assign(given.begin(), given.end());
  std::vector<std::int64_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    throw InvalidArgument("peer_ranks repeats rank " + std::to_string(*dup));
  }
  return ranks;
}

std::vector<std::int64_t> ranksOf(const std::vector<bool>& bitmap, const std::vector<std::int64_t>& ranks) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < bitmap.size(); ++i)
    if (bitmap[i]) out.push_back(ranks[i]);
  return out;
}

}  // namespace detail

std::string_view statusName(Status status) noexcept {
  switch (status) {
    case Status::kAgree: return "Agree";
    case Status::kAttributed: return "Attributed";
    case Status::kInconclusive: return "Inconclusive";
  }
  return "Unknown";
}

Status parseStatus(std::string_view name) {
  for (Status s : {Status::kAgree, Status::kAttributed, Status::kInconclusive})
    if (statusName(s) == name) return s;
  throw InvalidArgument("unknown status \"" + std::string(name) + "\" (expected Agree, Attributed or Inconclusive)");
}

Status worse(Status a, Status b) noexcept {
  auto rank = [](Status s) { return s == Status::kAttributed ? 2 : s == Status::kInconclusive ? 1 : 0; };
  return rank(b) > rank(a) ? b : a;
}

std::vector<std::int64_t> ExactResult::attributedRanks() const { return detail::ranksOf(bitmap, peer_ranks); }

ExactResult exact(std::span<const std::string> evidence, std::span<const std::int64_t> peer_ranks) {
  const std::size_t n = evidence.size();
  if (n == 0) throw InvalidArgument("exact consensus needs evidence from at least one peer");
  ExactResult result;
  result.peer_ranks = detail::checkedPeerRanks(peer_ranks, n);
  result.evidence.assign(evidence.begin(), evidence.end());
  result.bitmap.assign(n, false);

  // Count each distinct value; remember the first position holding it so the choice of
  // the majority value never depends on hash-table iteration order.
  std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> counts;  // value -> (count, first)
  for (std::size_t i = 0; i < n; ++i) {
    auto [it, inserted] = counts.try_emplace(evidence[i], 0, i);
    ++it->second.first;
  }
  std::size_t best_count = 0;
  std::size_t best_first = 0;
  for (const auto& [value, entry] : counts) {
    if (entry.first > best_count || (entry.first == best_count && entry.second < best_first)) {
      best_count = entry.first;
      best_first = entry.second;
    }
  }
  result.majority_count = best_count;
  if (2 * best_count <= n) {
    result.status = Status::kInconclusive;
    return result;
  }
  result.majority_position = static_cast<int>(best_first);
  const std::string_view majority = evidence[best_first];
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) {
    result.bitmap[i] = evidence[i] != majority;
    any = any || result.bitmap[i];
  }
  result.status = any ? Status::kAttributed : Status::kAgree;
  return result;
}

ExactResult c3Exact(Transport& transport, std::string_view evidence) {
  std::vector<std::string> gathered = transport.allGather(evidence);
  std::vector<std::int64_t> ranks = transport.peerRanks();
  return exact(gathered, ranks);
}

}  // namespace lmr::consensus
