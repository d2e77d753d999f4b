// Deciding what a stall is, from every daemon's view of its rank, gathered once visible
// progress stopped. Pure and deterministic: every daemon computes the same report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lmr/oob/progress.h"

namespace lmr::oob {

// One rank as its daemon saw it at the stall.
struct RankView {
  std::int64_t rank = 0;
  bool present = false;        // its daemon answered the gather
  Snapshot snapshot;
  std::int64_t stalled_ns = 0;  // time since the rank's last visible progress
  std::int64_t dataloader_ns = 0;           // a next() in flight for this long (0: none)
  std::int64_t dataloader_observed_ns = 0;  // how long this daemon has watched that same next()
  std::int64_t checkpoint_ns = 0;           // checkpoint I/O in flight for this long (0: none)
  std::int64_t checkpoint_observed_ns = 0;  // how long this daemon has watched that same I/O
  std::string host;
};

struct DiagnosisOptions {
  // A DataLoader next() or checkpoint I/O call is a stall when it has been in flight longer
  // than io_absolute_ns, longer than io_relative times the peers' median duration of the same
  // kind of call (their in-flight one, else their last completed one), and the daemon has
  // itself watched that same call stay in flight for io_persistence_ns.
  std::int64_t io_absolute_ns = 5'000'000'000;
  double io_relative = 4.0;
  std::int64_t io_persistence_ns = 2'000'000'000;
};

// What diagnose() concludes (the report kinds of a stall; see diagnose below).
namespace report_kind {
inline constexpr const char* kCollectiveDesync = "collective_desync";
inline constexpr const char* kProcessStall = "process_stall";
inline constexpr const char* kDataloaderStall = "dataloader_stall";
inline constexpr const char* kCheckpointIoStall = "checkpoint_io_stall";
inline constexpr const char* kUnresponsiveRank = "unresponsive_rank";
inline constexpr const char* kGroupStall = "group_stall";
inline constexpr const char* kInconclusiveStall = "inconclusive_stall";
}  // namespace report_kind

inline constexpr const char* kScopeRank = "rank";             // ranks attributed
inline constexpr const char* kScopePeerGroup = "peer_group";  // inconclusive about who

struct FaultReport {
  std::string kind;   // a report_kind
  std::string scope;  // kScopeRank or kScopePeerGroup
  std::vector<std::int64_t> ranks;       // attributed ranks (empty for peer_group)
  std::vector<std::string> hosts;        // their hosts
  std::vector<std::int64_t> missing_ranks;  // daemons that did not answer
  nlohmann::json evidence;               // per-rank summaries the decision used
};

// `views` holds one entry per rank of the peer group, present or not. Rank attribution
// needs a strict majority of the whole group present; otherwise inconclusive_stall. Rules,
// in order, over the present ranks:
// 1. A strict minority with a DataLoader next() (then: checkpoint I/O) in flight past the
//    absolute, relative and persistence thresholds: dataloader_stall / checkpoint_io_stall.
// 2. A strict minority outside any collective while the rest wait in one: process_stall.
// 3. Everyone in a collective, a strict minority at a different step or with a different
//    fingerprint: collective_desync on that minority.
// 4. Everyone present at the same step in the same collective: unresponsive_rank on the
//    missing ranks when some are missing, else group_stall (scope peer_group, no rank).
// 5. Anything else (no strict majority): inconclusive_stall, scope peer_group.
FaultReport diagnose(const std::vector<RankView>& views, const DiagnosisOptions& options = {});

nlohmann::json toJson(const FaultReport& report);

}  // namespace lmr::oob
