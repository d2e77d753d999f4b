#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "lmr/common/error.h"
#include "lmr/consensus/consensus.h"
#include "peer_ranks.h"

namespace lmr::consensus {
namespace {

constexpr double kMadToSigma = 1.4826;  // MAD of a normal distribution -> standard deviation

double medianOf(std::vector<double> values) {
  const std::size_t n = values.size();
  auto mid = values.begin() + static_cast<std::ptrdiff_t>(n / 2);
  std::nth_element(values.begin(), mid, values.end());
  double upper = *mid;
  if (n % 2 == 1) return upper;
  double lower = *std::max_element(values.begin(), mid);
  return lower + (upper - lower) / 2.0;
}

void checkOptions(const TimingOptions& o) {
  auto bad = [](double v) { return !std::isfinite(v) || v < 0.0; };
  if (bad(o.kappa)) throw InvalidArgument("timing option kappa must be finite and >= 0");
  if (bad(o.scale_floor)) throw InvalidArgument("timing option scale_floor must be finite and >= 0");
  if (bad(o.absolute_threshold)) throw InvalidArgument("timing option absolute_threshold must be finite and >= 0");
  if (bad(o.relative_threshold)) throw InvalidArgument("timing option relative_threshold must be finite and >= 0");
}

}  // namespace

std::vector<std::int64_t> TimingResult::attributedRanks() const { return detail::ranksOf(bitmap, peer_ranks); }

TimingResult timing(std::span<const double> seconds, const TimingOptions& options,
                    std::span<const std::int64_t> peer_ranks) {
  checkOptions(options);
  const std::size_t n = seconds.size();
  if (n == 0) throw InvalidArgument("timing consensus needs evidence from at least one peer");
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(seconds[i]) || seconds[i] < 0.0) {
      throw InvalidArgument("timing of peer " + std::to_string(i) + " is not a finite non-negative number");
    }
  }
  TimingResult result;
  result.peer_ranks = detail::checkedPeerRanks(peer_ranks, n);
  result.evidence.assign(seconds.begin(), seconds.end());
  result.bitmap.assign(n, false);

  std::vector<double> values(seconds.begin(), seconds.end());
  result.median = medianOf(values);
  for (double& v : values) v = std::fabs(v - result.median);
  result.mad = medianOf(values);
  result.scale = std::max(kMadToSigma * result.mad, options.scale_floor);

  if (n < std::max<std::size_t>(3, options.min_peers)) {
    result.status = Status::kInconclusive;  // no strict majority can vouch for anyone
    return result;
  }
  std::size_t outliers = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double excess = seconds[i] - result.median;
    const bool slow = excess > options.kappa * result.scale && excess > options.absolute_threshold &&
                      excess > options.relative_threshold * result.median;
    result.bitmap[i] = slow;
    outliers += slow ? 1 : 0;
  }
  if (outliers == 0) {
    result.status = Status::kAgree;
  } else if (2 * outliers < n) {
    result.status = Status::kAttributed;
  } else {
    result.status = Status::kInconclusive;
    result.bitmap.assign(n, false);
  }
  return result;
}

TimingResult c3Timing(Transport& transport, double seconds, const TimingOptions& options) {
  std::string mine(sizeof(double), '\0');
  std::memcpy(mine.data(), &seconds, sizeof(double));
  std::vector<std::string> gathered = transport.allGather(mine);
  std::vector<double> values(gathered.size());
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    if (gathered[i].size() != sizeof(double)) {
      throw PeerFailure("peer " + std::to_string(i) + " sent " + std::to_string(gathered[i].size()) +
                        " bytes of timing evidence, expected 8");
    }
    std::memcpy(&values[i], gathered[i].data(), sizeof(double));
  }
  std::vector<std::int64_t> ranks = transport.peerRanks();
  return timing(values, options, ranks);
}

}  // namespace lmr::consensus
