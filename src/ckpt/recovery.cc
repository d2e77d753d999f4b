#include "lmr/ckpt/recovery.h"

#include <algorithm>

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

// Whether the job (the manifest's topology) can select `c`: its own layout, or the same model
// from the durable tier (which may reshard on load; the load checks the back end).
bool selectable(const Manifest& m, const Checkpoint& c, bool durable_only) {
  if (durable_only && c.tier == Tier::kLatest) return false;
  const TopologyMatch match = matchTopology(c.topology, m.topology);
  return match == TopologyMatch::kSame || (match == TopologyMatch::kResharded && c.tier == Tier::kDurable);
}

// The newest checkpoint the job can select satisfying `usable`; at one step the fast tier first
// (it loads faster and holds the same state).
const Checkpoint* newest(const Manifest& m, bool verified_only, bool durable_only) {
  const Checkpoint* best = nullptr;
  for (const auto& c : m.checkpoints) {
    if (c.state == TrustState::kRejected || !selectable(m, c, durable_only)) continue;
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

TopologyMatch matchTopology(std::string_view saved, std::string_view job) {
  if (saved == job) return TopologyMatch::kSame;
  const auto slash_saved = saved.find('/'), slash_job = job.find('/');
  if (slash_saved == std::string_view::npos || slash_job == std::string_view::npos) return TopologyMatch::kOtherModel;
  return saved.substr(0, slash_saved) == job.substr(0, slash_job) ? TopologyMatch::kResharded
                                                                  : TopologyMatch::kOtherModel;
}

RecoveryDecision selectRecovery(const Manifest& m, Failure failure, std::int64_t at_step, EmergencyReplay emergency,
                                double now, bool durable_only) {
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
  if (durable_only) why += "; durable tier only (fast-tier snapshots stay on their nodes)";
  const Checkpoint* c = newest(m, verified_only, durable_only);
  if (!c) {
    d.mode = "unavailable";
    d.reason = why + "; no " + (verified_only ? "RECOVERY_VERIFIED" : "usable") + (durable_only ? " durable" : "") +
               " checkpoint this job can load";
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

RecoveryDecision withRestoreSources(RecoveryDecision decision, const std::vector<std::string>& sources) {
  std::vector<std::pair<std::string, std::vector<std::size_t>>> groups;
  for (std::size_t r = 0; r < sources.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == sources[r]; });
    if (it == groups.end()) it = groups.insert(groups.end(), {sources[r], {}});
    it->second.push_back(r);
  }
  std::string text;
  for (const auto& [source, ranks] : groups) {
    text += (text.empty() ? "" : "; ") + source + " on rank" + (ranks.size() > 1 ? "s " : " ");
    for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  if (!text.empty()) decision.reason += "; restored: " + text;
  return decision;
}

RecoveryDecision fallBackToDurable(const Manifest& manifest, const RecoveryDecision& decision, std::string_view why,
                                   double now) {
  const Failure failure = decision.failure.empty() ? Failure::kUncertain : parseFailure(decision.failure);
  RecoveryDecision d = selectRecovery(manifest, failure, decision.decided_at, EmergencyReplay::kNotRun, now, true);
  d.reason = decision.reason + "; " + decision.checkpoint_id + " could not be restored (" + std::string(why) + "): " +
             (d.available ? "the durable tier's " + d.checkpoint_id + " instead" : "no durable checkpoint either");
  d.restart = decision.restart;
  d.action = decision.action;
  d.blamed_ranks = decision.blamed_ranks;
  d.blamed_hosts = decision.blamed_hosts;
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

bool requireTopology(const Checkpoint& c, const std::string& job_topology, bool reshards) {
  switch (matchTopology(c.topology, job_topology)) {
    case TopologyMatch::kSame: return false;
    case TopologyMatch::kOtherModel:
      if (c.topology.find('/') == std::string::npos && job_topology.find('/') != std::string::npos)
        throw InvalidArgument("checkpoint \"" + c.id + "\" was recorded by an earlier version (topology " + c.topology +
                              ", one digest) that this version cannot compare with " + job_topology +
                              ": resume it with that version, or start a new run");
      throw InvalidArgument("checkpoint \"" + c.id + "\" holds another model (topology " + c.topology +
                            ", this job's " + job_topology +
                            "): parameter names, shapes or dtypes differ, so it cannot be loaded here");
    case TopologyMatch::kResharded: break;
  }
  if (c.tier != Tier::kDurable || !reshards)
    throw InvalidArgument("checkpoint \"" + c.id + "\" holds this model on another layout (world size or mesh; " +
                          c.topology + " against " + job_topology + ") and " +
                          (c.tier != Tier::kDurable ? std::string("the fast tier keeps one file per rank")
                                                    : std::string("its checkpoint back end does not reshard")) +
                          ": resume it on the world it was saved on, or from a durable DCP checkpoint");
  return true;
}

}  // namespace lmr::ckpt
