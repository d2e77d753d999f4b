// Recovery selection: which checkpoint a job resumes from after a failure
// (scout-operational-contract, "Checkpoint Certification and Recovery"):
//   detected SDC                                   -> newest RECOVERY_VERIFIED
//   a required rank or machine inaccessible        -> newest RECOVERY_VERIFIED
//   accessible straggler                           -> newest usable checkpoint (LATEST included)
//   hang or uncertain failure, every rank reachable -> newest usable only after a complete
//                                                     clean emergency replay of the catalog;
//                                                     otherwise newest RECOVERY_VERIFIED
// A checkpoint of another model is never selected; one of the same model saved on another
// layout (world size, mesh) only from the durable tier, whose back end may reshard on load.
// Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/ckpt/manifest.h"

namespace lmr::ckpt {

enum class Failure { kSdc, kInaccessible, kStraggler, kHang, kUncertain };
std::string_view name(Failure failure) noexcept;
Failure parseFailure(std::string_view text);  // InvalidArgument naming the accepted values

// The emergency full-catalog replay run before a hang or uncertain failure's decision.
enum class EmergencyReplay { kNotRun, kClean, kIncomplete, kSdc };
std::string_view name(EmergencyReplay replay) noexcept;
EmergencyReplay parseEmergencyReplay(std::string_view text);

// A job's topology is "<model>/<layout>": the model digest (every parameter's name, global shape
// and dtype) and the layout digest (world size, data-parallel mesh). A topology written before the
// split is one digest and matches only itself (never misread as a resharding).
enum class TopologyMatch { kSame, kResharded, kOtherModel };
TopologyMatch matchTopology(std::string_view saved, std::string_view job);

// `now`: seconds since the epoch, recorded as decided_time. `durable_only`: the fast tier is left
// out (its snapshots are node-local files per rank: they do not follow ranks to other nodes).
RecoveryDecision selectRecovery(const Manifest& manifest, Failure failure, std::int64_t at_step,
                                EmergencyReplay emergency = EmergencyReplay::kNotRun, double now = 0.0,
                                bool durable_only = false);

// The decision's fast-tier checkpoint could not be restored (`why`: say, no copy of some rank's
// in-memory snapshot is left): the same failure answered from the durable tier alone, keeping the
// decision's action, blame and restart; its reason says what happened to the first choice.
RecoveryDecision fallBackToDurable(const Manifest& manifest, const RecoveryDecision& decision, std::string_view why,
                                   double now = 0.0);

// The decision as the fast tier carried it out: where each rank's snapshot came from
// (`sources[r]`, e.g. "own memory", "a replica from rank 3"), grouped by source and appended to
// the reason ("; restored: own memory on ranks 0, 1, 3; a replica from rank 0 on rank 2").
RecoveryDecision withRestoreSources(RecoveryDecision decision, const std::vector<std::string>& sources);

// What a job starting up resumes from: the manifest's pending decision while its checkpoint is
// still listed; otherwise, when the manifest lists checkpoints, the decision for an uncertain
// failure (a crash or a stop nobody diagnosed) at the newest one's step, taken under
// `job_topology` (which becomes the manifest's); nullopt when it lists none (a fresh start).
// The plan's decision may be unavailable (nothing trusted): the job then starts over.
// A pending decision that escalated (the job cannot heal) is not resumed from: the plan says
// stop, and every relaunch stops at once instead of looping.
struct ResumePlan {
  RecoveryDecision decision;
  bool undiagnosed = false;  // there was no pending decision: this one is decided here
  bool stop = false;         // the pending decision escalated: do not train
};
std::optional<ResumePlan> planResume(Manifest& manifest, const std::string& job_topology, double now = 0.0);

// After an operator repaired or drained the blamed node: a pending escalation becomes the
// rollback it would have been, so the next start resumes from its checkpoint. False (nothing
// changed) when the manifest holds no pending escalation.
bool releaseEscalation(Manifest& manifest);

// A job continues the manifest's timeline from `step` (completed optimizer steps):
// checkpoints after it belong to an abandoned timeline and leave the manifest (returned, for
// their tiers to quarantine or remove); a taint detected after `step` ends with them.
std::vector<Checkpoint> continueFrom(Manifest& manifest, std::int64_t step);

// The job resumed from checkpoint `id`: checkpoints after its step belong to an abandoned
// timeline and leave the manifest (returned, for their tiers to quarantine or remove), the
// taint ends, the generation advances, and a pending decision becomes "applied".
// InvalidArgument for an unknown or REJECTED id.
std::vector<Checkpoint> applyRecovery(Manifest& manifest, const std::string& id);

// Whether this job can load `checkpoint`: true when it loads resharded (the same model on another
// layout, from the durable tier of a back end that `reshards`). InvalidArgument, saying which,
// for another model, or for another layout the checkpoint's tier or back end cannot reshard.
bool requireTopology(const Checkpoint& checkpoint, const std::string& job_topology, bool reshards = false);

}  // namespace lmr::ckpt
