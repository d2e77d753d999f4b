#include "lmr/ckpt/recovery.h"

#include "lmr/common/error.h"
#include "names.h"

namespace lmr::ckpt {
namespace {

constexpr Failure kFailures[] = {Failure::kSdc, Failure::kInaccessible, Failure::kStraggler, Failure::kHang,
                                 Failure::kUncertain};
constexpr EmergencyReplay kReplays[] = {EmergencyReplay::kNotRun, EmergencyReplay::kClean, EmergencyReplay::kIncomplete,
                                        EmergencyReplay::kSdc};

template <typename E, std::size_t N>
E parseName(std::string_view text, const E (&values)[N], const char* what) {
  if (auto v = detail::fromName(text, values)) return *v;
  throw InvalidArgument(std::string("unknown ") + what + " \"" + std::string(text) + "\" (expected " +
                        detail::namesOf(values) + ")");
}

// The newest checkpoint under the job's topology satisfying `usable`; at one step the fast
// tier first (it loads faster and holds the same state).
const Checkpoint* newest(const Manifest& m, bool verified_only) {
  const Checkpoint* best = nullptr;
  for (const auto& c : m.checkpoints) {
    if (c.state == TrustState::kRejected || c.topology != m.topology) continue;
    if (verified_only && c.state != TrustState::kRecoveryVerified) continue;
    if (!best || c.step > best->step || (c.step == best->step && c.tier == Tier::kLatest)) best = &c;
  }
  return best;
}

}  // namespace

std::string_view name(Failure failure) noexcept {
  switch (failure) {
    case Failure::kSdc: return "sdc";
    case Failure::kInaccessible: return "inaccessible";
    case Failure::kStraggler: return "straggler";
    case Failure::kHang: return "hang";
    case Failure::kUncertain: return "uncertain";
  }
  return "?";
}

std::string_view name(EmergencyReplay replay) noexcept {
  switch (replay) {
    case EmergencyReplay::kNotRun: return "not_run";
    case EmergencyReplay::kClean: return "clean";
    case EmergencyReplay::kIncomplete: return "incomplete";
    case EmergencyReplay::kSdc: return "sdc";
  }
  return "?";
}

Failure parseFailure(std::string_view text) { return parseName(text, kFailures, "failure"); }
EmergencyReplay parseEmergencyReplay(std::string_view text) {
  return parseName(text, kReplays, "emergency replay outcome");
}

RecoveryDecision selectRecovery(const Manifest& m, Failure failure, std::int64_t at_step, EmergencyReplay emergency,
                                double now) {
  RecoveryDecision d;
  d.decided_time = now;
  d.failure = std::string(name(failure));
  d.decided_at = at_step;
  d.restart = failure == Failure::kSdc;
  bool verified_only = true;
  std::string why;
  switch (failure) {
    case Failure::kSdc: why = "detected SDC: only a recovery-verified state is trusted"; break;
    case Failure::kInaccessible: why = "a required rank or machine is inaccessible"; break;
    case Failure::kStraggler:
      verified_only = false;
      why = "an accessible straggler: the newest complete checkpoint holds correct state";
      break;
    case Failure::kHang:
    case Failure::kUncertain:
      verified_only = emergency != EmergencyReplay::kClean;
      why = verified_only ? "the emergency catalog replay was " + std::string(name(emergency)) +
                                ": only a recovery-verified state is trusted"
                          : "every rank is reachable and the emergency catalog replay was clean";
      break;
  }
  if (m.tainted_since && !verified_only) {
    verified_only = true;
    why += "; but SDC was detected at step " + std::to_string(*m.tainted_since) + ", so only a verified state";
  }
  const Checkpoint* c = newest(m, verified_only);
  if (!c) {
    d.mode = "unavailable";
    d.reason =
        why + "; no " + (verified_only ? "RECOVERY_VERIFIED" : "usable") + " checkpoint under the job's topology";
    return d;
  }
  d.mode = verified_only ? "rollback_verified" : "resume_latest";
  d.source = std::string(name(c->state));
  d.step = c->step;
  d.checkpoint_id = c->id;
  d.location = c->location;
  d.tier = std::string(name(c->tier));
  d.topology = c->topology;
  d.available = true;
  d.reason =
      why + "; selected " + c->id + " (step " + std::to_string(c->step) + ", " + std::string(name(c->state)) + ")";
  return d;
}

std::optional<ResumePlan> planResume(Manifest& m, const std::string& job_topology, double now) {
  const RecoveryDecision* pending = m.decision ? &*m.decision : nullptr;
  if (pending && pending->status == "pending" && pending->action == "escalate")
    return ResumePlan{*pending, false, true};
  if (pending && pending->status == "pending" && m.find(pending->checkpoint_id)) return ResumePlan{*pending, false};
  if (m.checkpoints.empty()) return std::nullopt;
  m.topology = job_topology;
  return ResumePlan{selectRecovery(m, Failure::kUncertain, m.checkpoints.back().step, EmergencyReplay::kNotRun, now),
                    true};
}

bool releaseEscalation(Manifest& m) {
  if (!m.decision || m.decision->status != "pending" || m.decision->action != "escalate") return false;
  m.decision->action = "rollback";
  m.decision->restart = m.decision->failure == "sdc";
  m.decision->reason += "; the escalation was released by the operator";
  return true;
}

std::vector<Checkpoint> continueFrom(Manifest& m, std::int64_t step) {
  std::vector<Checkpoint> out, kept;
  for (auto& c : m.checkpoints) (c.step > step ? out : kept).push_back(std::move(c));
  m.checkpoints = std::move(kept);
  if (m.tainted_since && *m.tainted_since > step) m.tainted_since.reset();
  return out;
}

std::vector<Checkpoint> applyRecovery(Manifest& m, const std::string& id) {
  const Checkpoint* from = m.find(id);
  if (!from) throw InvalidArgument("no checkpoint \"" + id + "\" in the manifest");
  if (from->state == TrustState::kRejected)
    throw InvalidArgument("checkpoint \"" + id + "\" is REJECTED (" + from->reason + ")");
  auto out = continueFrom(m, from->step);
  m.tainted_since.reset();
  m.generation += 1;
  if (m.decision) m.decision->status = "applied";
  return out;
}

void requireTopology(const Checkpoint& c, const std::string& job_topology) {
  if (c.topology != job_topology)
    throw InvalidArgument("checkpoint \"" + c.id + "\" was saved under topology " + c.topology +
                          " but this job's topology is " + job_topology +
                          " (world size, mesh or parameter shapes differ): it cannot be loaded here");
}

}  // namespace lmr::ckpt
