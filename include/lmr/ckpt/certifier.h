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
// - Between those boundaries the state may be captured to the fast tier as LATEST.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lmr/ckpt/manifest.h"

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
  bool latest = false;   // it may be captured to the fast tier (LATEST)
  bool performance_fault = false;  // a straggler was confirmed: capture, and report it
  std::string reason;
};

struct Changes {
  CaptureDecision capture;
  std::vector<std::string> promoted;  // ids now RECOVERY_VERIFIED: commit_candidate them
  std::vector<std::string> rejected;  // ids now REJECTED: quarantine them
};

class Certifier {
 public:
  // `catalog`: every recipe a complete cycle covers (InvalidArgument when empty). `manifest`
  // is the state to continue from (an empty one for a new job) and `completed` the job's
  // completed steps: checkpoints after it are dropped (continueFrom, recovery.h; abandoned()
  // lists them), so a job that starts over never promotes or resumes another timeline's.
  // `dynamic`: the catalog is a dynamic one (see above).
  Certifier(std::vector<std::string> catalog, Manifest manifest, std::int64_t completed = 0, bool dynamic = false);
  const std::vector<Checkpoint>& abandoned() const { return abandoned_; }

  // A check concluded after step `outcome.step`. Steps never go back (InvalidArgument).
  Changes observe(const CheckOutcome& outcome);
  // A boundary without a check: whether the state may go to the fast tier.
  CaptureDecision boundary(std::int64_t step) const;
  // A capture that succeeded (after observe/boundary allowed it). InvalidArgument for a
  // duplicate id or a step before the last checkpoint's.
  void captured(Checkpoint checkpoint);
  // A checkpoint a tier removed (retention): dropped from the manifest.
  void removed(const std::string& id);
  // The job resumed from checkpoint `id`: applyRecovery (recovery.h), and the cycle in
  // progress starts over.
  std::vector<Checkpoint> recovered(const std::string& id);
  void setDecision(RecoveryDecision decision) { manifest_.decision = std::move(decision); }

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
  Manifest manifest_;
  std::vector<Checkpoint> abandoned_;
};

}  // namespace lmr::ckpt
