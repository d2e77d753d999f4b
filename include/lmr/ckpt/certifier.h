// Checkpoint certification: what the state at an optimizer boundary may become, decided from
// the job-wide outcome of each SCOUT check (the harness agrees it over every rank first, so
// every rank's Certifier reaches the same decisions). Pure state machine; not thread-safe.
//
// The rules (scout-operational-contract, "Checkpoint Certification and Recovery"):
// - SDC at a check: the current state is rejected and stays tainted until a recovery; every
//   CANDIDATE and LATEST checkpoint is rejected (none was validated after the fault); the
//   cycle in progress is dropped. RECOVERY_VERIFIED checkpoints stay.
// - Inconclusive exact evidence: the current state is not captured; the check counts for
//   nothing in the cycle (it stays incomplete until its recipes agree at a later check).
// - Healthy, or a straggler without SDC (reported as a performance fault): the recipes the
//   check accepted count towards the cycle. When the accepted recipes since the cycle began
//   cover the catalog, the cycle is complete: a CANDIDATE captured at the previous cycle's
//   end is promoted to RECOVERY_VERIFIED, and the state now is captured as a CANDIDATE, or
//   as RECOVERY_VERIFIED when this one check covered the whole catalog (a dense check) of a
//   static catalog. A dynamic catalog (MoE execution regimes, which grow as training admits
//   shapes) never verifies at once: its first complete accepted cycle makes a CANDIDATE and
//   the next one promotes it.
// - Between those boundaries the state may be captured to the fast tier as LATEST, every
//   `latest_interval` steps.
// - A state-integrity SDC found between checks, on a replica group spanning the world (so
//   every rank holds the same verdict), is a boundary of its own: observed at once.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lmr/ckpt/manifest.h"
#include "lmr/ckpt/recovery.h"

namespace lmr::ckpt {

// In increasing severity: the job-wide outcome of a check is the worst of its ranks'.
enum class Outcome { kHealthy, kStraggler, kInconclusive, kSdc };
inline constexpr Outcome kOutcomes[] = {Outcome::kHealthy, Outcome::kStraggler, Outcome::kInconclusive, Outcome::kSdc};
std::string_view name(Outcome outcome) noexcept;
Outcome parseOutcome(std::string_view text);  // InvalidArgument listing the accepted names

// What one rank's check result (a ReplayResult) holds that certification reads.
struct CheckEvidence {
  std::vector<std::string> sdc_sources;  // surfaces that attributed SDC
  bool sdc_attributed = false;           // any peer attributed (the result's SDC bitmap)
  bool straggler = false;                // a confirmed straggler
  bool inconclusive = false;             // the result's status is Inconclusive
  std::vector<std::string> checked_recipes;
  std::vector<std::string> inconclusive_recipes;
  std::map<std::string, std::string> inconclusive_reasons;  // recipe or surface -> reason
};

struct LocalOutcome {
  Outcome outcome = Outcome::kHealthy;
  std::vector<bool> accepted;  // by catalog position: checked and not inconclusive
  std::string reason;
};

// One rank's outcome for certification. SDC when a surface attributed it, or when replicas'
// held state (a state surface, replay::isStateSource) split with no strict majority:
// replicas must hold identical state, so corruption is certain, only its place is not (a
// split of recomputed values may be nondeterminism and stays inconclusive). Then
// inconclusive, straggler, healthy. Ranks agree on the worst outcome afterwards.
LocalOutcome classify(const CheckEvidence& evidence, const std::vector<std::string>& catalog);

// The verdict of an emergency replay (a full check before a hang's or an uncertain failure's
// decision) from the job-wide outcome and the catalog recipes every rank accepted: SDC; clean
// when nothing worse than a straggler was seen and every recipe was accepted; else incomplete.
EmergencyReplay emergencyVerdict(Outcome worst, const std::vector<bool>& accepted);

// What the caller knows of one optimizer boundary (the same on every rank).
struct BoundaryFacts {
  std::int64_t step = 0;
  bool checked = false;                   // a SCOUT check concluded at this boundary
  bool integrity_sdc_everywhere = false;  // a state-integrity SDC not yet observed, whose peers span the world
};

// What the caller does at a boundary.
enum class BoundaryAction {
  kSkip,     // nothing can be captured: no check, no integrity SDC to observe, no snapshot due
  kCapture,  // no check: ask boundary(step) whether the due fast-tier snapshot may be taken
  kObserve,  // agree the outcome over the ranks (the check's, made SDC by an integrity finding) and observe() it
};
std::string_view name(BoundaryAction action) noexcept;

struct CheckOutcome {
  std::int64_t step = 0;
  Outcome outcome = Outcome::kHealthy;
  std::vector<std::string> accepted_recipes;  // recipes that ran and agreed on every rank
  std::string reason;                         // what SDC or inconclusive evidence was seen
};

// What may be done with the state at a boundary.
struct CaptureDecision {
  bool durable = false;  // capture it now through save_candidate, with state `state`
  TrustState state = TrustState::kLatest;
  bool latest = false;    // it may be captured to the fast tier (LATEST)
  bool snapshot = false;  // ... and a fast-tier snapshot is due at this step (its interval, or a
                          // completed cycle's capture, certified like the durable one): take it
  bool performance_fault = false;  // a straggler was confirmed: capture, and report it
  std::string reason;
};

struct Changes {
  CaptureDecision capture;
  std::vector<std::string> promoted;  // ids now RECOVERY_VERIFIED: commit_candidate them
  std::vector<std::string> rejected;  // ids now REJECTED: quarantine them
  bool recover = false;  // this check tainted the state: decide a recovery (failure sdc) now
};

class Certifier {
 public:
  // `catalog`: every recipe a complete cycle covers (InvalidArgument when empty). `manifest`
  // is the state to continue from (an empty one for a new job) and `completed` the job's
  // completed steps: checkpoints after it are dropped (continueFrom, recovery.h; abandoned()
  // lists them), so a job that starts over never promotes or resumes another timeline's.
  // `dynamic`: the catalog is a dynamic one (see above). `latest_interval`: steps between
  // fast-tier snapshots, 0 for none.
  Certifier(std::vector<std::string> catalog, Manifest manifest, std::int64_t completed = 0, bool dynamic = false,
            std::int64_t latest_interval = 0);
  const std::vector<Checkpoint>& abandoned() const { return abandoned_; }

  // What to do at a boundary (see BoundaryAction).
  BoundaryAction atBoundary(const BoundaryFacts& facts) const;
  // A check concluded after step `outcome.step`. Steps never go back (InvalidArgument).
  Changes observe(const CheckOutcome& outcome);
  // A boundary without a check: whether the state may go to the fast tier.
  CaptureDecision boundary(std::int64_t step) const;
  // A capture that succeeded (after observe/boundary allowed it). InvalidArgument for a
  // duplicate id or a step before the last checkpoint's. Returns the ids to commit now:
  // this one when it was captured RECOVERY_VERIFIED (a dense check), else none.
  std::vector<std::string> captured(Checkpoint checkpoint);
  // A checkpoint a tier removed (retention): dropped from the manifest, unless a pending
  // decision names it (the relaunch loads it; false then).
  bool removed(const std::string& id);
  // The fast-tier checkpoints the manifest lists and has not rejected.
  std::vector<Checkpoint> snapshots() const;
  // The job resumed from checkpoint `id`: applyRecovery (recovery.h), and the cycle in
  // progress starts over.
  std::vector<Checkpoint> recovered(const std::string& id);
  void setDecision(RecoveryDecision decision) { manifest_.setDecision(std::move(decision)); }

  const Manifest& manifest() const { return manifest_; }
  const std::vector<std::string>& catalog() const { return catalog_; }
  // Recipes accepted in the cycle in progress.
  std::vector<std::string> covered() const { return {covered_.begin(), covered_.end()}; }

 private:
  std::vector<std::string> rejectUntrusted(const std::string& reason, std::int64_t after_step);

  std::vector<std::string> catalog_;
  std::set<std::string> catalog_set_;
  std::set<std::string> covered_;
  std::int64_t last_step_ = -1;
  bool dynamic_ = false;
  std::int64_t latest_interval_ = 0;
  Manifest manifest_;
  std::vector<Checkpoint> abandoned_;
};

}  // namespace lmr::ckpt
