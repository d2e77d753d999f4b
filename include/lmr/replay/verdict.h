// The verdict of one replay check, from what every peer voted: which recipes are ready
// to run, and, once they ran, which surfaces agree, which peers a strict majority names,
// what is Inconclusive and why, and which stragglers are confirmed. Pure functions over
// the gathered votes (every rank holds the same votes, so every rank reaches the same
// verdict), plus the straggler tracker's state. Thread-safe except for the tracker.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lmr/consensus/consensus.h"
#include "lmr/replay/replay.h"

namespace lmr::replay {

// Who compares with whom in a check. Compute peers replay the same thing; state peers
// (subsets of them) hold the same state: DDP replicas, HSDP's replicate peers of a shard,
// or, with no replica at all, every shard peer comparing materialized tensors.
// With MoE expert parallelism (lmr::mesh's expert role) two more: expert groups hold the
// same experts and compare expert replay; expert-parallel groups exchange tokens and judge
// the AllToAll replay's routing.
struct PeerLayout {
  std::vector<std::int64_t> ranks;                      // compute peers, in position order
  std::vector<std::vector<std::int64_t>> state_groups;  // each a subset of `ranks`
  std::vector<std::vector<std::int64_t>> expert_groups = {};  // empty: no experts
  std::vector<std::vector<std::int64_t>> ep_groups = {};      // each in expert-parallel rank order
};

// Throws InvalidArgument when ranks repeat, a group is empty or holds a rank that is not a
// compute peer, or a compute peer is in two groups of one kind.
void validate(const PeerLayout& layout);

// The peer whose captured inputs and parameters everyone replays after `step` (rotating).
std::int64_t sourceRank(const PeerLayout& layout, std::int64_t step);

// An evidence surface by name: "hidden.1.output" is recipe "hidden.1", evidence "output".
// Two MoE families: an expert's surfaces ("moe.1.expert.5.output", recipe part containing
// ".expert.") are compared within the expert group that voted them (its state surfaces
// within the state groups inside it); "routing" surfaces ("moe.1.alltoall.routing") are
// judged per expert-parallel group by lmr::moe::decideRouting.
struct SurfaceName {
  std::string recipe;
  std::string evidence;
  bool state = false;    // held state (params, state), compared among state peers
  bool expert = false;   // an expert's evidence
  bool routing = false;  // AllToAll routing verification
};
SurfaceName parseSurface(std::string_view name);

// --- readiness, before any recipe collective --------------------------------------------

struct ReadinessVote {
  std::map<std::string, std::string> contracts;  // recipe -> contract digest (contractDigest)
  std::map<std::string, std::string> reasons;    // recipe -> why it is not ready on that peer
};

struct Readiness {
  std::vector<bool> ready;                     // by recipe, as given
  std::map<std::string, std::string> reasons;  // why each recipe that is not ready is not
};

// A recipe is ready when no peer gave a reason and every peer's contract is the same.
// Reasons name the first peer (by position) that gave one: "<reason> (rank R)".
Readiness decideReadiness(const PeerLayout& layout, const std::vector<std::string>& recipes,
                          const std::vector<ReadinessVote>& votes);

// --- the check --------------------------------------------------------------------------

struct CheckVote {
  std::map<std::string, std::string> surfaces;             // surface name -> fingerprint bytes
  std::map<std::string, std::vector<double>> repetitions;  // recipe -> replay seconds
  std::map<std::string, std::string> errors;               // recipe -> the first local error
};

struct SurfaceVerdict {
  consensus::Status status = consensus::Status::kAgree;
  std::vector<bool> bitmap;           // by compute-peer position
  std::vector<std::string> evidence;  // by compute-peer position, as voted
  bool split = false;                 // some group disagreed with no strict majority
};

struct CheckVerdict {
  consensus::Status status = consensus::Status::kAgree;  // Attributed > Inconclusive > Agree
  std::vector<bool> sdc_bitmap;                          // union over attributed surfaces
  std::vector<std::string> sdc_sources;                  // surfaces that attributed someone, sorted
  std::map<std::string, SurfaceVerdict> surfaces;
  std::vector<std::string> inconclusive;       // recipes (not ready, failed) then surfaces (split)
  std::map<std::string, std::string> reasons;  // for each entry of `inconclusive`
  std::vector<bool> straggler_bitmap;          // confirmed
  std::vector<bool> straggler_candidates;      // this check's outliers

  // Agree with every bitmap sized for `peers`.
  static CheckVerdict forPeers(std::size_t peers);
  // Marks `what` (a recipe or surface) Inconclusive for `why` (the last reason wins).
  void addInconclusive(const std::string& what, const std::string& why);
};

// Decides a check after `step`. `checked`: the recipes that ran (ready everywhere);
// `not_ready`: the recipes that did not, with their reasons (Inconclusive already).
// A recipe with an error on any peer is Inconclusive on every peer (`replay_error: <text>
// (rank R)`, the first peer by position) and its surfaces and timings are dropped. State
// surfaces are compared within each state group, compute surfaces among all compute
// peers (the MoE families as SurfaceName says); a surface whose group has no strict majority
// is Inconclusive (`no_majority`). A surface belongs to the recipe its name starts with
// ("moe.1.expert.5.output" to "moe.1").
// Timings of a recipe every peer timed go to `tracker`.
CheckVerdict decideCheck(const PeerLayout& layout, std::int64_t step, const std::vector<std::string>& checked,
                         const std::vector<std::pair<std::string, std::string>>& not_ready,
                         const std::vector<CheckVote>& votes, StragglerTracker& tracker);

}  // namespace lmr::replay
