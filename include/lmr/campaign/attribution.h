// Explaining a localization system's attributions by campaign ground truth: which injected
// occurrence an attribution belongs to, which ones are the lasting consequence of a state
// fault that has ended (residual divergence), and which nothing explains (a false
// attribution). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lmr/campaign/manifest.h"
#include "lmr/campaign/record.h"

namespace lmr::campaign {

// One rank named by one evidence source at one check.
struct Attribution {
  std::int64_t step = 0;  // the training iteration the check followed
  std::int64_t rank = 0;
  std::string source;     // e.g. "hidden.1.output", "optimizer.0.state"
  std::string kind;       // "sdc", "straggler", ...
  bool state = false;     // the evidence compares held state (parameters, optimizer state), not recomputed values
};

enum class Explanation : std::uint8_t { kOccurrence, kResidual, kUnexplained };
std::string_view name(Explanation e) noexcept;  // "occurrence", "residual", "unexplained"

struct Explained {
  Explanation explanation = Explanation::kUnexplained;
  std::string occurrence_id;  // the occurrence it belongs to, or whose residual it is ("" when unexplained)
};

// When an injected occurrence was active, in training iterations: from its first activation
// (the records' actual_iteration) for as long as its lifetime says; `last` is absent while
// unbounded (until campaign end or replacement; until recovery ends at the next recovery).
struct OccurrenceWindow {
  std::string occurrence_id;
  std::int64_t first = 0;
  std::optional<std::int64_t> last;
  std::vector<std::int64_t> ranks;        // every action's expected rank
  std::vector<std::int64_t> state_ranks;  // expected ranks of its weight, bias or optimizer-state actions
};

// The windows of every occurrence that was activated, in order of first iteration.
// `recoveries`: iterations at which training resumed from a checkpoint.
std::vector<OccurrenceWindow> occurrenceWindows(const Campaign& campaign, const std::vector<InjectionRecord>& records,
                                                const std::vector<std::int64_t>& recoveries = {});

// Explains each attribution, in order:
// 1. an occurrence active at its step whose actions name its rank;
// 2. a residual: state evidence ("sdc" kind) naming a rank whose weight, bias or optimizer
//    state an ended occurrence corrupted, with no recovery since it ended (the corrupted
//    values fed real updates; the replica stays diverged until training recovers): the
//    most recently ended such occurrence;
// 3. any occurrence active at its step (the attribution names a wrong rank; scoring says so);
// 4. unexplained.
std::vector<Explained> explainAttributions(const Campaign& campaign, const std::vector<InjectionRecord>& records,
                                           const std::vector<Attribution>& attributions,
                                           const std::vector<std::int64_t>& recoveries = {});

}  // namespace lmr::campaign
