// C3 consensus: decide, from one piece of evidence per equivalent peer, whether the peers
// agree, which peers a strict majority marks as divergent, or that the evidence cannot
// justify naming anyone.
//
// The decision functions are pure: the result depends only on the evidence in peer-position
// order, never on the order in which it arrived, so every rank that holds the same gathered
// evidence reaches the same decision. They are thread-safe and do not block.
//
// c3Exact/c3Timing add the gather step over a Transport (blocking, collective: every peer
// of the transport must call the same function).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lmr::consensus {

enum class Status : std::uint8_t { kAgree = 0, kAttributed = 1, kInconclusive = 2 };

// "Agree", "Attributed" or "Inconclusive".
std::string_view statusName(Status status) noexcept;
// The inverse of statusName; InvalidArgument naming the three.
Status parseStatus(std::string_view name);
// The worse of two statuses where several verdicts make one (a check's surfaces, a check and
// its state-integrity verdict): Attributed > Inconclusive > Agree.
Status worse(Status a, Status b) noexcept;

// Result of exact (byte-equality) consensus.
struct ExactResult {
  Status status = Status::kInconclusive;
  std::vector<bool> bitmap;            // by peer position: true = differs from the majority
  std::vector<std::string> evidence;   // by peer position, as given
  std::vector<std::int64_t> peer_ranks;  // peer position -> global rank
  std::size_t majority_count = 0;      // how many peers hold the most frequent value
  int majority_position = -1;          // first peer holding the majority value (-1: no strict majority)

  // Global ranks of the peers set in `bitmap`, in peer order.
  std::vector<std::int64_t> attributedRanks() const;
};

// Options of robust timing consensus. Thresholds are in the unit of the timings
// (seconds in the Python API).
struct TimingOptions {
  double kappa = 3.0;                // outlier when t - median > kappa * scale ...
  double scale_floor = 1e-4;         // ... where scale = max(1.4826 * MAD, scale_floor)
  double absolute_threshold = 1e-3;  // ... and t - median > absolute_threshold
  double relative_threshold = 0.05;  // ... and t - median > relative_threshold * median
  std::size_t min_peers = 3;         // fewer peers (never below 3): Inconclusive
};

// Result of robust timing consensus.
struct TimingResult {
  Status status = Status::kInconclusive;
  std::vector<bool> bitmap;              // by peer position: true = slow outlier
  std::vector<double> evidence;          // timings by peer position, as given
  std::vector<std::int64_t> peer_ranks;  // peer position -> global rank
  double median = 0.0;
  double mad = 0.0;                      // median absolute deviation (unscaled)
  double scale = 0.0;                    // max(1.4826 * mad, scale_floor)

  std::vector<std::int64_t> attributedRanks() const;
};

// Exact strict-majority consensus. Let v be the most frequent evidence value, held by c of
// the N peers. If c > N/2 the result is Agree when every peer holds v and Attributed
// otherwise, with every peer not holding v set in the bitmap. If c <= N/2 (ties, 1-vs-1)
// the result is Inconclusive with an empty bitmap.
// `peer_ranks` maps positions to global ranks; empty means identity (rank = position).
// Throws InvalidArgument when evidence is empty, or peer_ranks has the wrong size or repeats.
ExactResult exact(std::span<const std::string> evidence, std::span<const std::int64_t> peer_ranks = {});

// Robust timing consensus: median m, scale d = max(1.4826 * MAD, scale_floor); peer i is a
// slow outlier when t_i - m > kappa * d and t_i - m exceeds both the absolute and the
// relative threshold. Fewer than max(3, min_peers) peers, or outliers that are not a strict
// minority, give Inconclusive. Throws InvalidArgument for non-finite or negative timings,
// bad options, or bad peer_ranks.
TimingResult timing(std::span<const double> seconds, const TimingOptions& options = {},
                    std::span<const std::int64_t> peer_ranks = {});

// A group of equivalent peers that can all-gather small byte strings. Implementations:
// the OOB daemon's gloo group, the test suite's in-process threads. allGather blocks until
// every peer contributed and returns the contributions in peer-position order.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int position() const = 0;                              // this peer's position
  virtual std::vector<std::int64_t> peerRanks() const = 0;      // position -> global rank
  virtual std::vector<std::string> allGather(std::string_view mine) = 0;
};

// Gather this peer's evidence from every peer, then decide. Collective over `transport`.
ExactResult c3Exact(Transport& transport, std::string_view evidence);
TimingResult c3Timing(Transport& transport, double seconds, const TimingOptions& options = {});

}  // namespace lmr::consensus
