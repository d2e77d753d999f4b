// Decisions of in-process replay: which recipes run at an optimizer boundary, the
// readiness contract peers compare before any recipe collective, and when a slow peer is
// confirmed as a straggler. Pure functions and a small state machine; no tensors here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lmr/consensus/consensus.h"

namespace lmr::replay {

// Cadence of the recipe classes, in optimizer steps. A recipe interval of -1 inherits
// check_interval; 0 disables that recipe; check_interval 0 means manual checks only.
struct Cadence {
  std::int64_t check_interval = 100;
  std::int64_t embedding_interval = -1;
  std::int64_t hidden_interval = -1;  // -1: the base interval, shortened so that every layer is covered within 100 steps
  std::int64_t output_interval = -1;
  std::int64_t optimizer_interval = -1;
};

struct Plan {
  bool embedding = false;
  std::optional<std::int64_t> hidden_layer;    // global layer index, rotating
  bool output = false;
  std::optional<std::int64_t> optimizer_slice;  // rotating slice of the parameters
  bool empty() const { return !embedding && !hidden_layer && !output && !optimizer_slice; }
  // "embedding", "hidden.<i>", "output", "optimizer.<s>", in that order.
  std::vector<std::string> recipeIds() const;
};

// The effective interval of each recipe class (0 = disabled). Throws InvalidArgument for
// negative values other than -1, or no layers.
struct Intervals {
  std::int64_t embedding, hidden, output, optimizer;
};
Intervals effectiveIntervals(const Cadence& cadence, std::int64_t layers);

// What runs after optimizer step `step` (1-based) completes. A recipe with interval k runs
// at every multiple of k; the hidden recipe visits layer ((step / k) - 1) mod layers, the
// optimizer recipe slice ((step / k) - 1) mod slices.
Plan planAt(const Cadence& cadence, std::int64_t step, std::int64_t layers, std::int64_t slices);
// Every recipe once (manual checks).
Plan fullPlan(std::int64_t step, std::int64_t layers, std::int64_t slices);

// The readiness contract as 16 bytes: SHA-256 of a length-prefixed encoding of the fields
// (optimizer step, recipe set, layer and shape identity, capture step, tensor metadata).
// Peers compare it with exact C3 before any recipe collective.
std::string contractDigest(const std::vector<std::string>& fields);

struct StragglerOptions {
  consensus::TimingOptions timing;      // per-check outlier test
  std::int64_t confirmation_rounds = 3;  // consecutive outlier checks needed
  std::int64_t temporal_window = 1000;   // the rounds must fall within this many steps
};

// Confirms stragglers across checks of one recipe class. A peer becomes a confirmed
// straggler once it is an outlier in `confirmation_rounds` consecutive checks spanning at
// most `temporal_window` steps; a check where it is not an outlier resets its streak. Not
// thread-safe.
class StragglerTracker {
 public:
  explicit StragglerTracker(StragglerOptions options);
  struct Verdict {
    consensus::TimingResult check;  // this check's timing consensus
    std::vector<bool> confirmed;    // by peer position
  };
  // `seconds` by peer position for the recipe class `recipe` at `step`.
  Verdict observe(const std::string& recipe, std::int64_t step, const std::vector<double>& seconds,
                  const std::vector<std::int64_t>& peer_ranks);

 private:
  struct Streak {
    std::int64_t count = 0, first_step = 0;
  };
  StragglerOptions options_;
  std::map<std::pair<std::string, std::int64_t>, Streak> streaks_;  // (recipe, rank)
};

}  // namespace lmr::replay
