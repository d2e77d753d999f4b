#include "lmr/campaign/session.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "lmr/common/error.h"
#include "lmr/common/sha256.h"

namespace lmr::campaign {
namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

bool persistent(const Lifetime& lifetime) {
  return lifetime.kind == LifetimeKind::kUntil || (lifetime.kind == LifetimeKind::kIterations && lifetime.count > 1);
}

std::optional<double> number(const Json& parameters, const char* key) {
  const Json* v = json::findMember(parameters, key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    throw InvalidArgument(std::string("parameter ") + key + ": \"" + s + "\" is not a number");
  }
  return v->get<double>();
}

std::string text(const Json& parameters, const char* key, std::string fallback) {
  const Json* v = json::findMember(parameters, key);
  return v == nullptr ? fallback : v->get<std::string>();
}

std::optional<std::string> optionalText(const Json& parameters, const char* key) {
  const Json* v = json::findMember(parameters, key);
  if (v == nullptr) return std::nullopt;
  return v->get<std::string>();
}

}  // namespace

std::optional<std::size_t> pickExecutor(const Incident& incident, const Fault& fault,
                                        const std::vector<ExecutorInfo>& executors, const std::string& where) {
  const SafetyClass need = requiredSafety(fault.type, fault.target.surface);
  const std::string type(name(fault.type));
  for (std::size_t i = 0; i < executors.size(); ++i) {
    const ExecutorInfo& ex = executors[i];
    const auto& types = ex.supported_types;
    if (std::find(types.begin(), types.end(), fault.type) == types.end()) continue;
    const auto& surfaces = ex.supported_surfaces;
    if (!surfaces.empty() && std::find(surfaces.begin(), surfaces.end(), fault.target.surface) == surfaces.end())
      continue;
    if (ex.max_safety < need) {
      throw InvalidArgument(where + ": executor " + quoted(ex.name) + " supports " + type + " but its safety ceiling " +
                            std::string(name(ex.max_safety)) + " is below " + std::string(name(need)));
    }
    if (incident.lifetime.kind == LifetimeKind::kMatchingCalls && !ex.completes_inline) {
      throw InvalidArgument(where + ": a matching_calls lifetime needs an executor declared completes_inline=True; " +
                            quoted(ex.name) + " is not");
    }
    if (persistent(incident.lifetime) && ex.one_shot) {
      throw InvalidArgument(where + ": a persistent lifetime cannot use the one_shot executor " + quoted(ex.name));
    }
    return i;
  }
  if (isBuiltInEffect(fault.type, fault.target.surface)) return std::nullopt;
  throw InvalidArgument(where + ": no executor supports " + type + " on surface " +
                        quoted(std::string(name(fault.target.surface))) + " (configure one with executors=...)");
}

std::string activationProblem(const Lifetime& lifetime, bool one_shot, bool active) {
  if (active && one_shot) return "a one_shot executor returned an active effect";
  if (active && lifetime.kind == LifetimeKind::kMatchingCalls)
    return "a matching_calls lifetime needs the effect complete when activation returns (active=False)";
  if (!active && persistent(lifetime)) return "a persistent lifetime needs an active effect to deactivate later";
  return "";
}

EffectSpec effectSpec(const Fault& fault) {
  const Json& p = fault.parameters;
  const bool drop = fault.type == FailureType::kDrop;
  EffectSpec spec;
  spec.type = fault.type;
  spec.surface = fault.target.surface;
  spec.scope = inject::parseScope(text(p, "scope", "single"));
  spec.corruption.operation = inject::parseOperation(text(p, "operation", drop ? "set_value" : "sign_flip"));
  spec.corruption.magnitude = inject::parseMagnitude(text(p, "magnitude", "medium"));
  spec.corruption.value = drop ? std::optional<double>(0.0) : number(p, "value");
  spec.corruption.factor = number(p, "factor");
  spec.corruption.stddev = number(p, "std");
  spec.delay_ms = number(p, "delay_ms").value_or(0.0);
  spec.parameter = optionalText(p, "parameter");
  spec.state_key = optionalText(p, "state_key");
  return spec;
}

Session::Session(std::shared_ptr<const Campaign> campaign, std::shared_ptr<StateStore> store, std::int64_t rank,
                 std::optional<std::int64_t> world, std::int64_t completed)
    : campaign_(std::move(campaign)),
      store_(std::move(store)),
      rank_(rank),
      world_(world),
      completed_at_start_(completed),
      origin_(campaign_->origin() == ClockOrigin::kCampaignStart ? completed : 0),
      schedule_(campaign_, origin_, completed),
      lookahead_(campaign_, origin_, completed) {
  if (store_ == nullptr) throw InvalidArgument("a campaign session needs a state store");
}

void Session::setPlacement(std::vector<RankPlace> placement) {
  if (rank_ >= static_cast<std::int64_t>(placement.size()))
    throw InvalidArgument("the placement names " + std::to_string(placement.size()) + " ranks; it must hold rank " +
                          std::to_string(rank_));
  std::set<std::pair<std::string, std::int64_t>> seen;
  for (std::size_t r = 0; r < placement.size(); ++r) {
    if (!seen.insert({placement[r].host, placement[r].local_rank}).second)
      throw InvalidArgument("the placement gives rank " + std::to_string(r) + " the place of another rank: host \"" +
                            placement[r].host + "\", local rank " + std::to_string(placement[r].local_rank));
  }
  placement_ = std::move(placement);
}

std::optional<std::int64_t> Session::executionRank(const Target& target) const {
  if (!target.host) return target.executionRank();
  if (placement_.empty())
    throw InvalidArgument("target.host \"" + *target.host +
                          "\": a host-bound fault needs the ranks' placement (Session::setPlacement)");
  const RankPlace wanted{*target.host, target.local_rank.value_or(0)};
  for (std::size_t r = 0; r < placement_.size(); ++r)
    if (placement_[r] == wanted) return static_cast<std::int64_t>(r);
  return std::nullopt;
}

InjectionRecord Session::recordOf(std::size_t incident, std::size_t fault, const Candidate& c,
                                  std::int64_t attempt) const {
  InjectionRecord r = makeRecord(*campaign_, incident, fault, c, attempt);
  if (campaign_->incidents()[incident].faults[fault].target.host) r.execution_rank = r.expected_rank.emplace(rank_);
  return r;
}

const std::vector<Assignment>& Session::prepare(const std::vector<ExecutorInfo>& executors) {
  assignments_.clear();
  const auto& incidents = campaign_->incidents();
  for (std::size_t i = 0; i < incidents.size(); ++i) {
    for (std::size_t f = 0; f < incidents[i].faults.size(); ++f) {
      const Fault& fault = incidents[i].faults[f];
      const std::string where = "incidents[" + std::to_string(i) + "].faults[" + std::to_string(f) + "]";
      std::optional<std::int64_t> runs_on;
      try {
        runs_on = executionRank(fault.target);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(where + "." + e.message());
      }
      if (runs_on != rank_) continue;
      assignments_.push_back({i, f, pickExecutor(incidents[i], fault, executors, where)});
    }
  }
  if (world_) {
    for (std::size_t i = 0; i < incidents.size(); ++i) {
      for (std::size_t f = 0; f < incidents[i].faults.size(); ++f) {
        if (incidents[i].faults[f].target.host) continue;  // resolved by placement above
        const std::int64_t r = incidents[i].faults[f].target.executionRank();
        if (r >= *world_) {
          throw InvalidArgument("incidents[" + std::to_string(i) + "].faults[" + std::to_string(f) + "].target.rank: " +
                                std::to_string(r) + " is outside the world of " + std::to_string(*world_) + " ranks");
        }
      }
    }
  }
  journal_ = store_->load();
  if (journal_) checkJournalBinding(*journal_, *campaign_);
  prepared_ = true;
  return assignments_;
}

std::string Session::agreementDigest() const {
  return sha256Hex(campaign_->identity() + "|" + std::to_string(completed_at_start_) + "|" +
                   (journal_ ? journal_->dump() : std::string("none")));
}

void Session::start() {
  if (!prepared_) throw InvalidArgument("Session::start before prepare");
  if (journal_) return;
  const Journal fresh = Journal::fresh(*campaign_);
  if (!store_->compareAndSwap(std::nullopt, fresh))
    throw InvalidArgument("the state store changed while the campaign was being enabled");
  journal_ = fresh;
}

std::vector<std::string> Session::expired(std::int64_t completed) const {
  std::vector<std::string> out;
  for (const auto& [id, armed] : armed_)
    if (armed.last && completed >= *armed.last) out.push_back(id);
  return out;
}

std::vector<Action> Session::observe(std::int64_t completed) {
  std::vector<Action> out;
  for (const Candidate& c : lookahead_.dueAt(completed + 2)) {
    if (!c.selected) continue;
    const Incident& inc = campaign_->incidents()[c.incident];
    for (const Assignment& a : assignments_) {
      if (a.incident != c.incident || a.executor) continue;
      const Fault& fault = inc.faults[a.fault];
      if (fault.type != FailureType::kStaleState && fault.type != FailureType::kDuplicate) continue;
      const std::string occurrence = occurrenceId(inc.incident_id, c.position);
      out.push_back({c.incident, a.fault, c.position, c.iteration, 1, occurrence,
                     injectionId(occurrence, fault.fault_id), std::nullopt});
    }
  }
  return out;
}

void Session::swapJournal(const Journal& updated, const std::string& what) {
  if (!store_->compareAndSwap(journal_, updated))
    throw InvalidArgument("the state store changed under " + what + "; another worker owns this campaign");
  journal_ = updated;
}

ArmPlan Session::arm(std::int64_t iteration) {
  if (!journal_) throw InvalidArgument("Session::arm before start");
  ArmPlan plan;
  std::vector<InjectionRecord> made;
  for (const Candidate& c : schedule_.dueAt(iteration)) {
    const Incident& inc = campaign_->incidents()[c.incident];
    const std::string key = inc.incident_id + "@" + std::to_string(c.position);
    if (!c.selected) {
      for (const Assignment& a : assignments_) {
        if (a.incident != c.incident) continue;
        InjectionRecord r = recordOf(c.incident, a.fault, c, 1);
        if (!record_index_.count(r.injection_id)) made.push_back(std::move(r));
      }
      continue;
    }
    const std::optional<std::int64_t> attempt = nextAttempt(inc, c.position, *journal_);
    if (!attempt) continue;  // fired before: the retrigger policy allows no more
    for (const Fault& f : inc.faults)
      plan.all_safe = plan.all_safe && requiredSafety(f.type, f.target.surface) == SafetyClass::kSafeInProcess;
    swapJournal(withAttempt(*journal_, inc.incident_id, c.position, *attempt), key);
    const std::string occurrence = occurrenceId(inc.incident_id, c.position, *attempt);
    for (const Assignment& a : assignments_) {
      if (a.incident != c.incident) continue;
      made.push_back(recordOf(c.incident, a.fault, c, *attempt));
      plan.actions.push_back({c.incident, a.fault, c.position, iteration, *attempt, occurrence,
                              injectionId(occurrence, inc.faults[a.fault].fault_id), a.executor});
    }
  }
  for (InjectionRecord& r : made) {
    record_index_[r.injection_id] = records_.size();
    records_.push_back(std::move(r));
  }
  return plan;
}

InjectionRecord& Session::record(const std::string& injection_id) {
  auto it = record_index_.find(injection_id);
  if (it == record_index_.end()) throw InvalidArgument("no injection \"" + injection_id + "\" in this session");
  return records_[it->second];
}

bool Session::activated(const std::string& injection_id, const std::string& executor, bool verified,
                        const Json& evidence, const std::string& error, bool exhausted) {
  InjectionRecord& r = record(injection_id);
  const std::int64_t armed_for = r.training_iteration;
  r.executor = executor;
  r.verified = verified;
  r.actual_iteration = armed_for;
  r.activation_evidence = evidence;
  r.error = error;
  if (!(verified || (error.empty() && !exhausted))) return false;
  r.transition(RecordStatus::kActive);
  const Incident& inc = *campaign_->findIncident(r.incident_id);
  Armed armed;
  armed.armed_for = armed_for;
  armed.last = inc.lifetime.lastActiveIteration(armed_for);
  if (inc.lifetime.kind == LifetimeKind::kUntil) armed.until = inc.lifetime.until;
  armed_.emplace_back(injection_id, armed);
  return true;
}

void Session::activationRaised(const std::string& injection_id, const std::string& executor, const Json& evidence,
                               const std::string& error) {
  InjectionRecord& r = record(injection_id);
  r.executor = executor;
  r.verified = false;
  r.actual_iteration = r.training_iteration;
  r.activation_evidence = evidence;
  r.error = error;
  r.transition(RecordStatus::kFailed);
}

void Session::abandon(const std::string& injection_id, const std::string& reason) {
  InjectionRecord& r = record(injection_id);
  if (r.status != RecordStatus::kArmed) return;
  r.error = reason;
  r.transition(RecordStatus::kFailed);
}

void Session::settle(const std::string& injection_id, bool cancelled, std::string failed_reason, bool verified,
                     const Json& evidence, const std::string& error, const std::optional<Json>& deactivation) {
  InjectionRecord& r = record(injection_id);
  std::optional<Armed> armed;
  for (auto it = armed_.begin(); it != armed_.end(); ++it) {
    if (it->first != injection_id) continue;
    armed = it->second;
    armed_.erase(it);
    break;
  }
  if (deactivation) r.deactivation_evidence = *deactivation;
  if (armed && armed->replaced_early && failed_reason.empty())
    failed_reason = "its state was replaced by a checkpoint load before its lifetime ended";
  if (r.status == RecordStatus::kArmed) {
    r.transition(RecordStatus::kFailed);
    return;
  }
  if (r.status != RecordStatus::kActive) return;
  r.activation_evidence = evidence;
  if (!failed_reason.empty() || !verified) {
    r.verified = false;
    r.error = !failed_reason.empty() ? failed_reason : !error.empty() ? error : "not verified";
    r.transition(RecordStatus::kFailed);
  } else if (cancelled) {
    r.transition(RecordStatus::kCancelled);
  } else {
    r.verified = true;
    r.error.clear();
    r.transition(RecordStatus::kCompleted);
  }
}

void Session::replaced(const std::string& injection_id, std::int64_t completed) {
  for (auto& [id, armed] : armed_)
    if (id == injection_id && armed.last && completed < *armed.last) armed.replaced_early = true;
}

std::vector<std::string> Session::armedUntil(Until until) const {
  std::vector<std::string> out;
  for (const auto& [id, armed] : armed_)
    if (armed.until && *armed.until == until) out.push_back(id);
  return out;
}

std::vector<std::pair<std::string, bool>> Session::closing() const {
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& [id, armed] : armed_) out.emplace_back(id, !(armed.until && *armed.until == Until::kCampaignEnd));
  return out;
}

std::vector<std::string> Session::armedIds() const {
  std::vector<std::string> out;
  for (const auto& entry : armed_) out.push_back(entry.first);
  return out;
}

std::vector<InjectionRecord> Session::records() const { return records_; }

}  // namespace lmr::campaign
