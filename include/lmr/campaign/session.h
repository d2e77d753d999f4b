// The live side of a campaign on one rank: at each optimizer boundary it says what to do
// (observe history for a stale or duplicate fault, arm an injection, expire one), owns the
// restart-journal claim, the injection records and their settlement, executor eligibility,
// and every active window. The caller (the Python session) resolves targets, installs hooks,
// runs effects and executors, exchanges outcomes between ranks, and reports back.
//
// Clock: iteration N is the N-th optimizer update. An incident due at N is armed at the
// boundary after N - 1 completed and acts on the work that produces update N.
//
// A Session is not thread-safe: the caller serialises calls (the Python session holds its
// lock). Not copyable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lmr/campaign/journal.h"
#include "lmr/campaign/manifest.h"
#include "lmr/campaign/record.h"
#include "lmr/campaign/schedule.h"
#include "lmr/inject/corrupt.h"

namespace lmr::campaign {

// What a configured (external) executor declares about itself.
struct ExecutorInfo {
  std::string name;
  std::vector<FailureType> supported_types;
  SafetyClass max_safety = SafetyClass::kSafeInProcess;
  bool one_shot = false;         // activation always returns an inactive effect
  bool completes_inline = false;  // the effect is over when activation returns
  // The surfaces it runs the supported types on; empty: every surface.
  std::vector<Surface> supported_surfaces;
};

// The first executor of `executors` supporting the fault's type (and its surface, where
// the executor names surfaces), or nullopt for the
// built-in executor. Throws InvalidArgument starting with `where` when the first supporting
// executor's safety ceiling is too low or it cannot honour the incident's lifetime, and
// when nothing can run the fault.
std::optional<std::size_t> pickExecutor(const Incident& incident, const Fault& fault,
                                        const std::vector<ExecutorInfo>& executors, const std::string& where);

// Why an external executor's activation result breaks the lifetime contract ("" when it
// does not): one_shot executors and matching_calls lifetimes need an inactive result,
// persistent lifetimes an active one.
std::string activationProblem(const Lifetime& lifetime, bool one_shot, bool active);

// A built-in effect's parameters with every default applied (scope single; sign_flip, or
// set_value 0 for drop; magnitude medium; "nan"/"inf"/"-inf" values as numbers).
struct EffectSpec {
  FailureType type = FailureType::kTensorCorruption;
  Surface surface = Surface::kOutput;
  inject::Scope scope = inject::Scope::kSingle;
  inject::Spec corruption;
  double delay_ms = 0.0;                 // delay only
  std::optional<std::string> parameter;  // weight, bias, gradient, optimizer_state
  std::optional<std::string> state_key;  // optimizer_state
};
// Requires a fault whose parameters the manifest validated (validateBuiltInParameters).
EffectSpec effectSpec(const Fault& fault);

// Who runs one of this rank's faults.
struct Assignment {
  std::size_t incident = 0;
  std::size_t fault = 0;
  std::optional<std::size_t> executor;  // index into the executors given to prepare(); nullopt: built-in
};

// One thing to do at a boundary. Observe: start collecting history for a stale or duplicate
// fault due at the next boundary. Arm: run the action now (its record is armed).
struct Action {
  std::size_t incident = 0;
  std::size_t fault = 0;
  std::int64_t position = 0;   // the candidate as the manifest writes it
  std::int64_t iteration = 0;  // absolute training iteration it acts on
  std::int64_t attempt = 1;
  std::string occurrence_id;
  std::string injection_id;
  std::optional<std::size_t> executor;
};

struct ArmPlan {
  std::vector<Action> actions;  // this rank's actions, in manifest order
  // Every due action of every rank is safe_in_process (decided from the whole manifest,
  // so every rank reaches the same value): the post-activation exchange then runs.
  bool all_safe = true;
};

// Where one rank runs: its node (the node id host-bound targets name) and its rank there.
struct RankPlace {
  std::string host;
  std::int64_t local_rank = 0;
  bool operator==(const RankPlace&) const = default;
};

class Session {
 public:
  // `world`: the number of ranks of a distributed job (checked against every target rank),
  // nullopt for a single process. `completed`: optimizer updates done at enablement.
  Session(std::shared_ptr<const Campaign> campaign, std::shared_ptr<StateStore> store, std::int64_t rank,
          std::optional<std::int64_t> world, std::int64_t completed);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Where every rank runs (index: rank), for host-bound targets; before prepare. The same on
  // every rank. InvalidArgument when it does not hold this rank or names a place twice.
  void setPlacement(std::vector<RankPlace> placement);
  // The rank that runs `target` now: its rank; for a host-bound one, the rank at its
  // (host, local_rank), or nullopt when that node is not in the job (excluded, or never was).
  // InvalidArgument for a host-bound target without a placement.
  std::optional<std::int64_t> executionRank(const Target& target) const;

  // Enablement, step 1: assigns an executor to each of this rank's faults (errors name
  // incidents[i].faults[f]), checks target ranks against the world, loads the journal from
  // the store and checks it belongs to this manifest. Throws InvalidArgument.
  const std::vector<Assignment>& prepare(const std::vector<ExecutorInfo>& executors);
  // Equal on ranks that agree on the manifest, the completed iterations and the journal.
  std::string agreementDigest() const;
  // Enablement, step 2 (after the ranks agreed): stores a fresh journal when none was
  // loaded. Throws InvalidArgument when the store changed meanwhile.
  void start();

  std::int64_t originOffset() const { return origin_; }
  const std::vector<Assignment>& assignments() const { return assignments_; }
  // The next absolute iteration with a candidate, if any.
  std::optional<std::int64_t> nextDue() const { return schedule_.nextDue(); }

  // Injections whose window is over once `completed` iterations are done.
  std::vector<std::string> expired(std::int64_t completed) const;
  // History to start collecting at the boundary after `completed` (built-in stale_state and
  // duplicate faults of this rank due at completed + 2).
  std::vector<Action> observe(std::int64_t completed);
  // Arms what is due at `iteration`: records unselected candidates as skipped, claims each
  // selected one in the journal (retrigger policy; compare-and-swap in the store) and makes
  // its records. Throws InvalidArgument when another worker changed the store.
  ArmPlan arm(std::int64_t iteration);

  // After activation: records who ran the action and what it proved, and says whether it
  // stays armed (verified, or neither failed nor already exhausted). When it does not, the
  // caller deactivates it and calls settle().
  bool activated(const std::string& injection_id, const std::string& executor, bool verified, const Json& evidence,
                 const std::string& error, bool exhausted);
  // Activation raised: the record fails; nothing stays armed.
  void activationRaised(const std::string& injection_id, const std::string& executor, const Json& evidence,
                        const std::string& error);
  // An armed record that will never be activated (arming failed on some rank, or an
  // earlier activation raised) fails with `reason`; other records are left as they are.
  void abandon(const std::string& injection_id, const std::string& reason);
  // Ends an action after the caller deactivated it: completed when it took effect as
  // specified, cancelled when cut short (`cancelled`), failed when `failed_reason` is set,
  // it was never verified, or a checkpoint load replaced its state early. `verified`,
  // `evidence` and `error` are the effect's final values; `deactivation` its evidence.
  void settle(const std::string& injection_id, bool cancelled, std::string failed_reason, bool verified,
              const Json& evidence, const std::string& error, const std::optional<Json>& deactivation);
  // A checkpoint load replaced the state an armed action changed, after `completed`
  // iterations: settling fails it when its window had not ended.
  void replaced(const std::string& injection_id, std::int64_t completed);

  // Armed injections whose lifetime is `until` (recovery or replacement).
  std::vector<std::string> armedUntil(Until until) const;
  // Every armed injection with whether closing the campaign cancels it (all but
  // `until: campaign_end`).
  std::vector<std::pair<std::string, bool>> closing() const;
  std::vector<std::string> armedIds() const;

  // Every record of this rank, in creation order.
  std::vector<InjectionRecord> records() const;

 private:
  struct Armed {
    std::int64_t armed_for = 0;
    std::optional<std::int64_t> last;
    std::optional<Until> until;
    bool replaced_early = false;
  };
  InjectionRecord& record(const std::string& injection_id);
  InjectionRecord recordOf(std::size_t incident, std::size_t fault, const Candidate& c, std::int64_t attempt) const;
  void swapJournal(const Journal& updated, const std::string& what);

  std::shared_ptr<const Campaign> campaign_;
  std::shared_ptr<StateStore> store_;
  std::int64_t rank_;
  std::optional<std::int64_t> world_;
  std::vector<RankPlace> placement_;
  std::int64_t completed_at_start_;
  std::int64_t origin_;
  Schedule schedule_;
  Schedule lookahead_;
  std::vector<Assignment> assignments_;
  std::optional<Journal> journal_;
  bool prepared_ = false;
  std::vector<InjectionRecord> records_;
  std::map<std::string, std::size_t> record_index_;
  std::vector<std::pair<std::string, Armed>> armed_;  // in arming order
};

}  // namespace lmr::campaign
