// Decisions of in-process replay: which recipes run at an optimizer boundary, the
// readiness contract peers compare before any recipe collective, and when a slow peer is
// confirmed as a straggler. Pure functions and a small state machine; no tensors here.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/consensus/consensus.h"

namespace lmr::replay {

// Cadence of the recipe classes, in optimizer steps. A recipe interval of -1 inherits
// check_interval; 0 disables that recipe; check_interval 0 means manual checks only.
struct Cadence {
  std::int64_t check_interval = 100;
  std::int64_t embedding_interval = -1;
  // hidden_interval -1: the base interval, shortened so that every layer is covered within
  // coverage_steps (100) steps.
  std::int64_t hidden_interval = -1;
  std::int64_t output_interval = -1;
  std::int64_t optimizer_interval = -1;
  // moe_interval -1: the base interval, shortened as hidden_interval is over the MoE layers.
  std::int64_t moe_interval = -1;
  // The steps within which a shortened rotating recipe (hidden_interval, moe_interval -1)
  // visits each of its layers: longer is cheaper and slower to see a fault (worstCaseLatency).
  std::int64_t coverage_steps = 100;
};

// The recipe classes, in the order a check lays them out (its readiness vote has one slot each).
inline constexpr std::array<std::string_view, 5> kRecipeClasses = {"embedding", "hidden", "output", "optimizer", "moe"};

// The recipe classes the job's framework can replay (its adapter says which it cannot):
// `modules` false leaves out the embedding, hidden, output and MoE recipes (blocks that
// communicate inside their forward, under tensor parallelism), `optimizer` false the
// optimizer recipe (an update that cannot run on isolated copies).
struct PlanOptions {
  bool modules = true;
  bool optimizer = true;
};

struct Plan {
  bool embedding = false;
  std::optional<std::int64_t> hidden_layer;    // global layer index, rotating
  bool output = false;
  std::optional<std::int64_t> optimizer_slice;  // rotating slice of the parameters
  std::optional<std::int64_t> moe_layer;        // position in the MoE layer list, rotating
  bool empty() const { return !embedding && !hidden_layer && !output && !optimizer_slice && !moe_layer; }
  // "embedding", "hidden.<i>", "output", "optimizer.<s>", "moe.<position>", in that order
  // (callers name the MoE recipe by the layer's global index instead).
  std::vector<std::string> recipeIds() const;
};

// The effective interval of each recipe class (0 = disabled). Throws InvalidArgument for
// negative values other than -1, or no layers.
struct Intervals {
  std::int64_t embedding, hidden, output, optimizer;
  std::int64_t moe = 0;  // 0 as well when there are no MoE layers
};
Intervals effectiveIntervals(const Cadence& cadence, std::int64_t layers, std::int64_t moe_layers = 0);

// The worst-case detection latency of a cadence, in optimizer steps: from the first step a
// persistent fault shows in (a bad unit, a corrupted weight) to the boundary whose verdict
// sees it, counting both. A recipe of interval k that rotates over n items (layers, MoE
// layers, optimizer slices) revisits each every k * n steps, one that does not every k; a
// pipelined check concludes one boundary later. 0: never (the recipe is off). `modules`:
// until every replayed module (embedding, each layer, output, each MoE layer) was replayed
// once after the fault began, the largest of those.
struct Latency {
  std::int64_t embedding = 0, hidden = 0, output = 0, optimizer = 0, moe = 0;
  std::int64_t modules = 0;
};
Latency worstCaseLatency(const Cadence& cadence, std::int64_t layers, std::int64_t slices, std::int64_t moe_layers,
                         bool pipelined);

// What runs after optimizer step `step` (1-based) completes. A recipe with interval k runs
// at every multiple of k; the hidden recipe visits layer ((step / k) - 1) mod layers, the
// optimizer recipe slice ((step / k) - 1) mod slices, the MoE recipe MoE layer
// ((step / k) - 1) mod moe_layers.
// `options` leaves out what the framework cannot replay.
Plan planAt(const Cadence& cadence, std::int64_t step, std::int64_t layers, std::int64_t slices,
            std::int64_t moe_layers = 0, PlanOptions options = {});
// Every recipe once (manual checks), less what `options` leaves out.
Plan fullPlan(std::int64_t step, std::int64_t layers, std::int64_t slices, std::int64_t moe_layers = 0,
              PlanOptions options = {});

// The recipe ids a complete cycle of `cadence` covers (every recipe a manual check runs
// when check_interval is 0): "embedding", "hidden.<id>" for each of `layer_ids` (global
// indices), "output", "optimizer.<s>" for s < slices (slices 0: no optimizer recipe).
// "moe.<id>" for each of `moe_layer_ids` (global indices of the blocks holding an MoE layer).
// `layer_ids` lists the blocks the hidden recipe can replay (it may be empty when MoE layers
// are given: expert-parallel blocks without a dense part to replay).
// Disabled recipe classes are left out. Checkpoint certification completes a cycle when
// accepted checks have covered all of them.
std::vector<std::string> catalog(const Cadence& cadence, const std::vector<std::int64_t>& layer_ids,
                                 std::int64_t slices, const std::vector<std::int64_t>& moe_layer_ids = {});

// Whether the evidence surface `source` ("hidden.1.params", "optimizer.0.state", ...)
// compares held state (parameters, optimizer state) rather than recomputed values. State
// surfaces are compared among the peers holding the same state; a replica whose state
// diverged keeps showing there until training recovers.
bool isStateSource(std::string_view source) noexcept;

// The readiness contract as 16 bytes: SHA-256 of a length-prefixed encoding of the fields
// (optimizer step, recipe set, layer and shape identity, capture step, tensor metadata).
// Peers compare it with exact C3 before any recipe collective.
std::string contractDigest(const std::vector<std::string>& fields);

// The defaults of ReplayHarnessConfig's straggler settings (Python takes them from here).
struct StragglerOptions {
  // Per-check outlier test. A replay lasts milliseconds, so a slow peer must also exceed
  // the median by 5 ms and by a quarter of it: host noise of that size is common.
  consensus::TimingOptions timing{
      .kappa = 3.0, .scale_floor = 1e-4, .absolute_threshold = 0.005, .relative_threshold = 0.25, .min_peers = 3};
  std::int64_t confirmation_rounds = 3;  // k: outlier checks needed ...
  std::int64_t confirmation_checks = 5;  // n: ... among this many most recent checks of the recipe
  std::int64_t temporal_window = 1000;   // checks more than this many steps old are forgotten
};

// The defaults for a model's clock. Replays timed on the host clock (CPU models) take
// run-queue waits out, but time the hypervisor steals from a virtual CPU is invisible to the
// guest and comes in slices of several milliseconds: there a slow peer must exceed the
// median by 20 ms. Device clocks (CUDA events) keep the 5 ms above.
StragglerOptions stragglerDefaults(bool host_clock);

// Every default of a check that depends on where the model runs, decided here once. On a
// device (CUDA) a check is pipelined (its fingerprints and times are read at the next
// boundary, so the step does not wait for them), each timed replay runs once (events time
// the device), state integrity is on wherever a parameter has two or more holders, and a
// slow collective must exceed its class's median by 1 ms. On the host (CPU) checks complete
// at their boundary, timed replays take the fastest of 3 runs (host noise only adds time),
// state integrity is off (its digests cost a CPU job a noticeable share of its step), and a
// slow collective must exceed the median by 20 ms (hypervisor steal, as above).
struct CheckDefaults {
  StragglerOptions straggler;
  bool pipelined = true;
  std::int64_t timing_repeats = 1;
  bool state_integrity = true;       // where a parameter has two or more holders
  double comm_absolute_s = 1e-3;     // lmr::mesh::CommOptions::timing.absolute_threshold
};
CheckDefaults checkDefaults(bool host_clock);

// Whether state integrity also checks the state at rest by default (two reads per
// boundary): where peers are shards, not replicas, or the smallest replica group has fewer
// than 3 members (no strict majority can outvote one corrupted replica by the update alone).
bool integrityAtRestByDefault(bool replicas, std::int64_t smallest_group);

// Confirms compute stragglers across the checks of one recipe (e.g. "hidden.3").
//
// A straggler is slow every time; a noisy host is slow sometimes. Two rules use that:
// - Within a check, each peer times several repetitions of the replay; its evidence is the
//   fastest one (noise only ever adds time, so the minimum is the run least disturbed).
// - A peer is a confirmed straggler at a check when that check's timing consensus marks it
//   as a slow outlier and it was an outlier in at least `confirmation_rounds` of the last
//   `confirmation_checks` conclusive checks of the recipe (this one included) within
//   `temporal_window` steps. So one noisy check does not break a confirmation in progress.
// - A confirmed straggler stays reported only while each check's own evidence still says
//   "slow": the first conclusive check that does not ends the episode and forgets its
//   history, so a later confirmation needs `confirmation_rounds` fresh outlier checks.
// A check whose timing consensus is Inconclusive (too few peers, or no strict minority of
// outliers) is not counted for or against anyone. Not thread-safe.
class StragglerTracker {
 public:
  explicit StragglerTracker(StragglerOptions options);
  struct Verdict {
    consensus::TimingResult check;  // this check's timing consensus, on each peer's fastest repetition
    std::vector<bool> confirmed;    // by peer position
    std::vector<std::int64_t> outlier_checks;  // by peer position: outlier checks in the current window
  };
  // `repetitions[i]`: the replay times (one or more) of peer position i for `recipe` at `step`.
  // Throws InvalidArgument for an empty repetition list, or timings consensus rejects.
  Verdict observe(const std::string& recipe, std::int64_t step, const std::vector<std::vector<double>>& repetitions,
                  const std::vector<std::int64_t>& peer_ranks);
  // The same confirmation for a check decided elsewhere (its status, bitmap and peer_ranks
  // are used): a rule other than timing consensus, e.g. a pair of groups compared directly.
  Verdict confirm(const std::string& recipe, std::int64_t step, consensus::TimingResult check);
  const StragglerOptions& options() const { return options_; }

 private:
  struct Round {
    std::int64_t step = 0;
    bool outlier = false;
  };
  struct History {
    std::deque<Round> rounds;  // the recent conclusive checks, oldest first
    bool confirmed = false;    // reported as confirmed at its last conclusive check
  };
  StragglerOptions options_;
  std::map<std::pair<std::string, std::int64_t>, History> history_;  // (recipe, rank)
};

// The per-check timing evidence of one peer: the fastest of its repetitions. Throws
// InvalidArgument when `repetitions` is empty.
double fastestRepetition(const std::vector<double>& repetitions);

}  // namespace lmr::replay
