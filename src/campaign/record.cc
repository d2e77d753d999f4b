#include "lmr/campaign/record.h"

#include "lmr/common/error.h"

namespace lmr::campaign {
namespace {

using json::child;
using json::fail;

template <typename T>
Json optionalJson(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

std::optional<std::int64_t> optionalInteger(const Json& v, const std::string& path) {
  if (v.is_null()) return std::nullopt;
  return json::asInteger(v, path);
}

std::optional<std::string> optionalString(const Json& v, const std::string& path) {
  if (v.is_null()) return std::nullopt;
  return json::asIdentifier(v, path);
}

template <typename E>
E enumField(const Json& j, const std::string& path, const char* key, std::optional<E> (*parse)(std::string_view)) {
  const std::string p = child(path, key);
  const std::string s = json::asString(json::requireMember(j, path, key), p);
  auto v = parse(s);
  if (!v) fail(p, "unknown value \"" + s + "\"");
  return *v;
}

}  // namespace

bool InjectionRecord::injectionSucceeded() const {
  return verified && (status == RecordStatus::kActive || status == RecordStatus::kCompleted);
}

void InjectionRecord::transition(RecordStatus next) {
  const bool ok =
      (status == RecordStatus::kArmed &&
       (next == RecordStatus::kActive || next == RecordStatus::kFailed || next == RecordStatus::kCancelled)) ||
      (status == RecordStatus::kActive &&
       (next == RecordStatus::kCompleted || next == RecordStatus::kFailed || next == RecordStatus::kCancelled));
  if (!ok) {
    throw InvalidArgument("record " + injection_id + ": cannot move from " + std::string(name(status)) + " to " +
                          std::string(name(next)));
  }
  status = next;
}

Json InjectionRecord::toJson() const {
  return Json{{"injection_id", injection_id},
              {"occurrence_id", occurrence_id},
              {"incident_id", incident_id},
              {"fault_id", fault_id},
              {"iteration", iteration},
              {"training_iteration", training_iteration},
              {"actual_iteration", optionalJson(actual_iteration)},
              {"attempt", attempt},
              {"status", std::string(name(status))},
              {"type", std::string(name(type))},
              {"temporal_class", std::string(name(temporal_class))},
              {"safety_class", std::string(name(safety_class))},
              {"target", target},
              {"parameters", parameters},
              {"execution_rank", execution_rank},
              {"expected_rank", optionalJson(expected_rank)},
              {"expected_resource", optionalJson(expected_resource)},
              {"expected_host", optionalJson(expected_host)},
              {"expected_component", optionalJson(expected_component)},
              {"expected_layer", optionalJson(expected_layer)},
              {"expected_kind", expected_kind},
              {"executor", executor},
              {"verified", verified},
              {"injection_succeeded", injectionSucceeded()},
              {"activation_evidence", activation_evidence},
              {"deactivation_evidence", deactivation_evidence},
              {"error", error}};
}

InjectionRecord InjectionRecord::fromJson(const Json& j, const std::string& path) {
  json::requireKnownKeys(j, path,
                         {"injection_id",
                          "occurrence_id",
                          "incident_id",
                          "fault_id",
                          "iteration",
                          "training_iteration",
                          "actual_iteration",
                          "attempt",
                          "status",
                          "type",
                          "temporal_class",
                          "safety_class",
                          "target",
                          "parameters",
                          "execution_rank",
                          "expected_rank",
                          "expected_resource",
                          "expected_host",
                          "expected_component",
                          "expected_layer",
                          "expected_kind",
                          "executor",
                          "verified",
                          "injection_succeeded",
                          "activation_evidence",
                          "deactivation_evidence",
                          "error"});
  auto member = [&](const char* key) -> const Json& { return json::requireMember(j, path, key); };
  InjectionRecord r;
  r.injection_id = json::asIdentifier(member("injection_id"), child(path, "injection_id"));
  r.occurrence_id = json::asIdentifier(member("occurrence_id"), child(path, "occurrence_id"));
  r.incident_id = json::asIdentifier(member("incident_id"), child(path, "incident_id"));
  r.fault_id = json::asIdentifier(member("fault_id"), child(path, "fault_id"));
  r.iteration = json::asPositiveInteger(member("iteration"), child(path, "iteration"));
  r.training_iteration = json::asPositiveInteger(member("training_iteration"), child(path, "training_iteration"));
  r.actual_iteration = optionalInteger(member("actual_iteration"), child(path, "actual_iteration"));
  r.attempt = json::asPositiveInteger(member("attempt"), child(path, "attempt"));
  r.status = enumField(j, path, "status", parseRecordStatus);
  r.type = enumField(j, path, "type", parseFailureType);
  r.temporal_class = enumField(j, path, "temporal_class", parseTemporalClass);
  r.safety_class = enumField(j, path, "safety_class", parseSafetyClass);
  r.target = member("target");
  json::requireObject(r.target, child(path, "target"));
  r.parameters = member("parameters");
  json::requireObject(r.parameters, child(path, "parameters"));
  r.execution_rank = json::asNonNegativeInteger(member("execution_rank"), child(path, "execution_rank"));
  r.expected_rank = optionalInteger(member("expected_rank"), child(path, "expected_rank"));
  r.expected_resource = optionalString(member("expected_resource"), child(path, "expected_resource"));
  if (const Json* host = json::findMember(j, "expected_host"))
    r.expected_host = optionalString(*host, child(path, "expected_host"));
  r.expected_component = optionalString(member("expected_component"), child(path, "expected_component"));
  r.expected_layer = optionalInteger(member("expected_layer"), child(path, "expected_layer"));
  r.expected_kind = json::asIdentifier(member("expected_kind"), child(path, "expected_kind"));
  r.executor = json::asString(member("executor"), child(path, "executor"));
  r.verified = json::asBoolean(member("verified"), child(path, "verified"));
  const bool succeeded = json::asBoolean(member("injection_succeeded"), child(path, "injection_succeeded"));
  r.activation_evidence = member("activation_evidence");
  r.deactivation_evidence = member("deactivation_evidence");
  r.error = json::asString(member("error"), child(path, "error"));
  if (succeeded != r.injectionSucceeded()) {
    fail(child(path, "injection_succeeded"), std::string("is ") + (succeeded ? "true" : "false") +
                                                 " but the record is " + std::string(name(r.status)) +
                                                 (r.verified ? ", verified" : ", unverified"));
  }
  if (r.status == RecordStatus::kSkippedProbability && (r.verified || r.actual_iteration)) {
    fail(child(path, "status"), "a probability skip has no activation");
  }
  return r;
}

InjectionRecord makeRecord(const Campaign& campaign, std::size_t incident, std::size_t fault,
                           const Candidate& candidate, std::int64_t attempt) {
  const Incident& inc = campaign.incidents().at(incident);
  const Fault& f = inc.faults.at(fault);
  InjectionRecord r;
  r.incident_id = inc.incident_id;
  r.fault_id = f.fault_id;
  r.occurrence_id = occurrenceId(inc.incident_id, candidate.position, attempt);
  r.injection_id = injectionId(r.occurrence_id, f.fault_id);
  r.iteration = candidate.position;
  r.training_iteration = candidate.iteration;
  r.attempt = attempt;
  r.status = candidate.selected ? RecordStatus::kArmed : RecordStatus::kSkippedProbability;
  r.type = f.type;
  r.temporal_class = inc.temporalClass();
  r.safety_class = requiredSafety(f.type, f.target.surface);
  r.target = targetToJson(f.target);
  r.parameters = f.parameters;
  r.execution_rank = f.target.executionRank();
  r.expected_rank = f.target.expectedRank();
  r.expected_resource = f.target.resource;
  r.expected_host = f.target.host;
  r.expected_component = f.target.component;
  if (f.target.component == "transformer_block") r.expected_layer = f.target.index;
  r.expected_kind = std::string(expectedKind(f.type, f.target.surface));
  return r;
}

}  // namespace lmr::campaign
