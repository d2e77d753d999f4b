#include "lmr/moe/alltoall.h"

#include <algorithm>

#include "lmr/common/error.h"

namespace lmr::moe {

void validateMatrix(const Matrix& m, std::int64_t ranks, const std::string& what) {
  if (ranks < 1) throw InvalidArgument(what + ": an expert-parallel group needs at least one rank");
  if (static_cast<std::int64_t>(m.size()) != ranks)
    throw InvalidArgument(what + " has " + std::to_string(m.size()) + " rows, the group has " + std::to_string(ranks) +
                          " ranks");
  bool any = false;
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (static_cast<std::int64_t>(m[i].size()) != ranks)
      throw InvalidArgument(what + "[" + std::to_string(i) + "] has " + std::to_string(m[i].size()) +
                            " entries, the group has " + std::to_string(ranks) + " ranks");
    for (std::size_t j = 0; j < m[i].size(); ++j) {
      if (m[i][j] < 0)
        throw InvalidArgument(what + "[" + std::to_string(i) + "][" + std::to_string(j) + "] is negative (" +
                              std::to_string(m[i][j]) + ")");
      any = any || m[i][j] > 0;
    }
  }
  if (!any) throw InvalidArgument(what + " sends nothing");
}

std::vector<std::int64_t> defaultShifts(std::int64_t ranks, std::int64_t max_shifts) {
  if (ranks < 1) throw InvalidArgument("an expert-parallel group needs at least one rank");
  if (max_shifts < 1) throw InvalidArgument("AllToAll replay needs at least one cyclic shift (max_shifts >= 1)");
  const std::int64_t count = std::min(ranks, max_shifts);
  std::vector<std::int64_t> out;
  for (std::int64_t j = 0; j < count; ++j) out.push_back(j * ranks / count);
  return out;
}

std::vector<Matrix> defaultMatrices(std::int64_t ranks, std::int64_t rows, std::int64_t max_shifts) {
  if (rows < 1) throw InvalidArgument("AllToAll replay needs at least one token per segment");
  const std::vector<std::int64_t> shifts = defaultShifts(ranks, max_shifts);
  const auto n = static_cast<std::size_t>(ranks);
  std::vector<Matrix> out;
  out.emplace_back(n, std::vector<std::int64_t>(n, rows));
  for (std::int64_t k : shifts) {
    Matrix m(n, std::vector<std::int64_t>(n, 0));
    for (std::size_t i = 0; i < n; ++i) m[i][(i + static_cast<std::size_t>(k)) % n] = rows;
    out.push_back(std::move(m));
  }
  return out;
}

std::string routingVote(const std::vector<Matrix>& matrices, std::int64_t me,
                        const std::vector<std::vector<bool>>& bad) {
  if (bad.size() != matrices.size()) throw InvalidArgument("routingVote needs one verification per matrix");
  std::string vote;
  for (std::size_t m = 0; m < matrices.size(); ++m) {
    const auto ranks = static_cast<std::int64_t>(matrices[m].size());
    validateMatrix(matrices[m], ranks, "matrices[" + std::to_string(m) + "]");
    if (me < 0 || me >= ranks) throw InvalidArgument("receiver " + std::to_string(me) + " is not in the group");
    if (bad[m].size() != matrices[m].size())
      throw InvalidArgument("verification " + std::to_string(m) + " needs one entry per sender");
    for (std::size_t i = 0; i < matrices[m].size(); ++i)
      vote += matrices[m][i][static_cast<std::size_t>(me)] == 0 ? kNoSegment : (bad[m][i] ? kCorrupted : kIntact);
  }
  return vote;
}

RoutingVerdict decideRouting(const std::vector<std::string>& votes) {
  const std::size_t n = votes.size();
  RoutingVerdict v;
  v.bitmap.assign(n, false);
  if (n == 0) throw InvalidArgument("a routing verdict needs at least one receiver");
  for (std::size_t j = 0; j < n; ++j) {
    if (votes[j].empty() || votes[j].size() != votes[0].size() || votes[0].size() % n != 0) {
      v.status = consensus::Status::kInconclusive;
      v.reason = "alltoall_unverified: expert-parallel position " + std::to_string(j) +
                 " did not verify the same matrices as its group";
      return v;
    }
  }
  // sent[i] / got[j]: segments with a verdict; bad_sent / bad_got: those corrupted.
  std::vector<std::int64_t> sent(n, 0), got(n, 0), bad_sent(n, 0), bad_got(n, 0);
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < votes[j].size(); ++k) {
      const char c = votes[j][k];
      const std::size_t i = k % n;
      if (c == kNoSegment) continue;
      if (c != kIntact && c != kCorrupted) {
        v.status = consensus::Status::kInconclusive;
        v.reason = "alltoall_unverified: a malformed vote from expert-parallel position " + std::to_string(j);
        return v;
      }
      ++sent[i];
      ++got[j];
      if (c == kCorrupted) {
        ++bad_sent[i];
        ++bad_got[j];
      }
    }
  }
  for (std::size_t r = 0; r < n; ++r)
    v.bitmap[r] = (sent[r] > 0 && 2 * bad_sent[r] > sent[r]) || (got[r] > 0 && 2 * bad_got[r] > got[r]);
  bool attributed = false;
  for (bool b : v.bitmap) attributed = attributed || b;
  // A corrupted segment that neither its sender nor its receiver explains.
  for (std::size_t j = 0; j < n && v.reason.empty(); ++j) {
    for (std::size_t k = 0; k < votes[j].size(); ++k) {
      const std::size_t i = k % n;
      if (votes[j][k] == kCorrupted && !v.bitmap[i] && !v.bitmap[j]) {
        v.reason = "alltoall_segment: tokens from expert-parallel position " + std::to_string(i) + " to position " +
                   std::to_string(j) +
                   " arrived corrupted, and neither end has a strict majority of corrupted "
                   "segments (a link, or more than one rank)";
        break;
      }
    }
  }
  if (attributed) {
    v.status = consensus::Status::kAttributed;
  } else if (!v.reason.empty()) {
    v.status = consensus::Status::kInconclusive;
  }
  return v;
}

}  // namespace lmr::moe
