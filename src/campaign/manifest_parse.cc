// Manifest parsing and validation. Every check names the JSON path it failed at.
#include <set>
#include <string>

#include "lmr/campaign/manifest.h"
#include "lmr/common/error.h"
#include "lmr/common/sha256.h"

namespace lmr::campaign {
namespace {

using json::child;
using json::fail;
using json::findMember;
using json::item;
using json::requireMember;

constexpr std::string_view kIndexedComponents[] = {"transformer_block", "expert"};
constexpr std::string_view kPlainComponents[] = {"embedding", "output"};

bool contains(const auto& list, std::string_view v) {
  for (std::string_view x : list)
    if (x == v) return true;
  return false;
}

template <typename E>
E parseEnum(const Json& v, const std::string& path, std::optional<E> (*parse)(std::string_view), const char* allowed) {
  const std::string s = json::asString(v, path);
  auto e = parse(s);
  if (!e) fail(path, "unknown value \"" + s + "\" (allowed: " + allowed + ")");
  return *e;
}

std::optional<std::string> optionalIdentifier(const Json& obj, const std::string& path, std::string_view key) {
  const Json* v = findMember(obj, key);
  if (v == nullptr) return std::nullopt;
  return json::asIdentifier(*v, child(path, key));
}

Json objectOrEmpty(const Json& obj, const std::string& path, std::string_view key) {
  const Json* v = findMember(obj, key);
  if (v == nullptr) return Json::object();
  json::requireObject(*v, child(path, key));
  return *v;
}

Trigger parseTrigger(const Json& j, const std::string& path) {
  json::requireKnownKeys(j, path, {"at", "range", "probability"});
  Trigger t;
  const Json* at = findMember(j, "at");
  const Json* range = findMember(j, "range");
  if ((at == nullptr) == (range == nullptr)) fail(path, "needs exactly one of \"at\" or \"range\"");
  if (at != nullptr) {
    const std::string p = child(path, "at");
    if (!at->is_array() || at->empty()) fail(p, "must be a non-empty array of positive integers");
    for (std::size_t i = 0; i < at->size(); ++i) {
      const std::int64_t v = json::asPositiveInteger((*at)[i], item(p, i));
      if (!t.at.empty() && v <= t.at.back()) {
        fail(item(p, i), "must be sorted and unique: " + std::to_string(v) + " follows " + std::to_string(t.at.back()));
      }
      t.at.push_back(v);
    }
  } else {
    const std::string p = child(path, "range");
    json::requireKnownKeys(*range, p, {"start", "end", "every"});
    t.is_range = true;
    t.start = json::asPositiveInteger(requireMember(*range, p, "start"), child(p, "start"));
    t.end = json::asPositiveInteger(requireMember(*range, p, "end"), child(p, "end"));
    if (t.end < t.start) fail(child(p, "end"), "must be >= start (" + std::to_string(t.start) + ")");
    if (const Json* every = findMember(*range, "every")) t.every = json::asPositiveInteger(*every, child(p, "every"));
  }
  if (const Json* p = findMember(j, "probability")) {
    t.probability = json::asNumber(*p, child(path, "probability"));
    if (t.probability < 0.0 || t.probability > 1.0) fail(child(path, "probability"), "must be in [0, 1]");
  }
  return t;
}

Lifetime parseLifetime(const Json& j, const std::string& path) {
  json::requireKnownKeys(j, path, {"matching_calls", "iterations", "until"});
  if (j.size() != 1) fail(path, "needs exactly one of \"matching_calls\", \"iterations\" or \"until\"");
  Lifetime l;
  if (const Json* v = findMember(j, "matching_calls")) {
    l.kind = LifetimeKind::kMatchingCalls;
    l.count = json::asPositiveInteger(*v, child(path, "matching_calls"));
  } else if (const Json* v = findMember(j, "iterations")) {
    l.kind = LifetimeKind::kIterations;
    l.count = json::asPositiveInteger(*v, child(path, "iterations"));
  } else {
    l.kind = LifetimeKind::kUntil;
    l.count = 0;
    l.until = parseEnum<Until>(j.at("until"), child(path, "until"), parseUntil, "recovery, replacement, campaign_end");
  }
  return l;
}

Target parseTarget(const Json& j, const std::string& path) {
  json::requireKnownKeys(j, path,
                         {"surface", "rank", "model_part", "component", "index", "module_path", "operation", "resource",
                          "path", "host", "local_rank", "metadata"});
  Target t;
  t.surface = parseEnum<Surface>(requireMember(j, path, "surface"), child(path, "surface"), parseSurface,
                                 "input, output, weight, bias, gradient, optimizer_state, rng_state, sampler_state, "
                                 "data, checkpoint, compute, collective, process, resource, config");
  if (const Json* v = findMember(j, "rank")) t.rank = json::asNonNegativeInteger(*v, child(path, "rank"));
  if (const Json* v = findMember(j, "model_part"))
    t.model_part = json::asNonNegativeInteger(*v, child(path, "model_part"));
  t.component = optionalIdentifier(j, path, "component");
  if (const Json* v = findMember(j, "index")) t.index = json::asNonNegativeInteger(*v, child(path, "index"));
  t.module_path = optionalIdentifier(j, path, "module_path");
  t.operation = optionalIdentifier(j, path, "operation");
  t.resource = optionalIdentifier(j, path, "resource");
  t.path = optionalIdentifier(j, path, "path");
  t.host = optionalIdentifier(j, path, "host");
  if (const Json* v = findMember(j, "local_rank"))
    t.local_rank = json::asNonNegativeInteger(*v, child(path, "local_rank"));
  t.metadata = objectOrEmpty(j, path, "metadata");
  if (t.host && t.rank)
    fail(child(path, "rank"),
         "give \"rank\" or \"host\", not both (a host-bound fault runs on that node's "
         "\"local_rank\", whatever rank the job gives it)");
  if (t.local_rank && !t.host) fail(child(path, "local_rank"), "needs \"host\" (the node it counts on)");

  if (isModuleSurface(t.surface) && !t.component && !t.module_path) {
    fail(path,
         "surface \"" + std::string(name(t.surface)) + "\" names a module: give \"module_path\" or \"component\"");
  }
  if (t.component) {
    if (contains(kIndexedComponents, *t.component) && !t.index) {
      fail(child(path, "index"), "required for component \"" + *t.component + "\" (a global layer or expert index)");
    }
    if (contains(kPlainComponents, *t.component) && t.index) {
      fail(child(path, "index"), "component \"" + *t.component + "\" is not indexed");
    }
  } else if (t.index) {
    fail(child(path, "index"), "needs an indexed \"component\" (transformer_block or expert)");
  }
  return t;
}

Fault parseFault(const Json& j, const std::string& path) {
  json::requireKnownKeys(j, path, {"fault_id", "type", "target", "parameters"});
  Fault f;
  f.fault_id = json::asIdentifier(requireMember(j, path, "fault_id"), child(path, "fault_id"));
  f.type = parseEnum<FailureType>(requireMember(j, path, "type"), child(path, "type"), parseFailureType,
                                  "tensor_corruption, stale_state, drop, duplicate, reorder, config_drift, delay, "
                                  "hang, timeout, exception, resource_exhaustion, process_termination, "
                                  "resource_unavailable, checkpoint_corruption, checkpoint_truncation, "
                                  "checkpoint_missing, io_error, payload_corruption, collective_desync, "
                                  "message_drop, network_partition");
  f.target = parseTarget(requireMember(j, path, "target"), child(path, "target"));
  f.parameters = objectOrEmpty(j, path, "parameters");
  if (isBuiltInEffect(f.type, f.target.surface)) {
    if (f.target.component && !f.target.module_path && !contains(kIndexedComponents, *f.target.component) &&
        !contains(kPlainComponents, *f.target.component)) {
      fail(child(child(path, "target"), "component"),
           "the built-in resolver knows transformer_block, expert, embedding and output; give \"module_path\" for "
           "other modules");
    }
    validateBuiltInParameters(f, child(path, "parameters"));
  }
  return f;
}

void checkIncidentRules(const Incident& inc, const std::string& path) {
  const Trigger& t = inc.trigger;
  const std::uint64_t n = t.candidateCount();
  const std::string lifetime_path = child(path, "lifetime");
  switch (inc.lifetime.kind) {
    case LifetimeKind::kUntil:
      if (n != 1) {
        fail(child(lifetime_path, "until"),
             "a permanent lifetime needs exactly one trigger candidate, the trigger has " + std::to_string(n));
      }
      break;
    case LifetimeKind::kMatchingCalls:
      for (std::size_t i = 0; i < inc.faults.size(); ++i) {
        if (isStateSurface(inc.faults[i].target.surface)) {
          fail(child(lifetime_path, "matching_calls"),
               "not valid for surface \"" + std::string(name(inc.faults[i].target.surface)) + "\" (faults[" +
                   std::to_string(i) + "]): state faults need \"iterations\" or \"until\"");
        }
      }
      if (inc.lifetime.count > 1 && n != 1) {
        fail(child(lifetime_path, "matching_calls"),
             "more than one call may span iterations: it needs exactly one trigger candidate, the trigger has " +
                 std::to_string(n));
      }
      break;
    case LifetimeKind::kIterations:
      // A bounded state fault is retired by subtracting its delta; a non-finite value has
      // no delta to subtract.
      for (std::size_t i = 0; i < inc.faults.size(); ++i) {
        const Fault& f = inc.faults[i];
        const Json* value = json::findMember(f.parameters, "value");
        if (isStateSurface(f.target.surface) && isBuiltInEffect(f.type, f.target.surface) && value != nullptr &&
            value->is_string()) {
          fail(child(child(item(child(path, "faults"), i), "parameters"), "value"),
               "a non-finite value on surface \"" + std::string(name(f.target.surface)) +
                   "\" cannot be retired after a bounded lifetime: use \"until\" and recover the workload");
        }
      }
      if (t.probability > 0.0) {
        if (auto spacing = t.minSpacing(); spacing && *spacing < inc.lifetime.count) {
          fail(child(lifetime_path, "iterations"), "active windows of " + std::to_string(inc.lifetime.count) +
                                                       " iterations overlap: trigger candidates are only " +
                                                       std::to_string(*spacing) + " apart");
        }
      }
      break;
  }
}

Incident parseIncident(const Json& j, const std::string& path) {
  json::requireKnownKeys(j, path, {"incident_id", "trigger", "lifetime", "retrigger", "max_occurrences", "faults"});
  Incident inc;
  inc.incident_id = json::asIdentifier(requireMember(j, path, "incident_id"), child(path, "incident_id"));
  inc.trigger = parseTrigger(requireMember(j, path, "trigger"), child(path, "trigger"));
  inc.lifetime = parseLifetime(requireMember(j, path, "lifetime"), child(path, "lifetime"));
  if (const Json* r = findMember(j, "retrigger")) {
    inc.retrigger =
        parseEnum<Retrigger>(*r, child(path, "retrigger"), parseRetrigger, "once, every_attempt, max_occurrences");
  }
  const Json* max = findMember(j, "max_occurrences");
  if (inc.retrigger == Retrigger::kMaxOccurrences) {
    if (max == nullptr) fail(child(path, "max_occurrences"), "required when retrigger is \"max_occurrences\"");
    inc.max_occurrences = json::asPositiveInteger(*max, child(path, "max_occurrences"));
  } else if (max != nullptr) {
    fail(child(path, "max_occurrences"), "only valid when retrigger is \"max_occurrences\"");
  }
  const Json& faults = requireMember(j, path, "faults");
  const std::string fp = child(path, "faults");
  if (!faults.is_array() || faults.empty()) fail(fp, "must be a non-empty array of fault objects");
  std::set<std::string> ids;
  for (std::size_t i = 0; i < faults.size(); ++i) {
    Fault f = parseFault(faults[i], item(fp, i));
    if (!ids.insert(f.fault_id).second) {
      fail(child(item(fp, i), "fault_id"), "duplicate fault_id \"" + f.fault_id + "\" in this incident");
    }
    inc.faults.push_back(std::move(f));
  }
  checkIncidentRules(inc, path);
  return inc;
}

Int128 parseSeed(const json::Document& doc) {
  const Json* v = findMember(doc.value, "seed");
  if (v == nullptr) return 0;
  if (auto big = doc.big_integers.find("seed"); big != doc.big_integers.end()) {
    auto parsed = json::parseInt128(big->second);
    if (!parsed) fail("seed", "does not fit a signed 128-bit integer: " + big->second);
    return *parsed;
  }
  if (v->is_number_unsigned()) return static_cast<Int128>(v->get<std::uint64_t>());
  return json::asInteger(*v, "seed");
}

}  // namespace

Campaign Campaign::parse(std::string_view text, std::string_view source) {
  return fromDocument(json::parse(text, source));
}

Campaign Campaign::fromDocument(const json::Document& doc) {
  const Json& j = doc.value;
  json::requireKnownKeys(j, "", {"schema_version", "name", "seed", "clock", "incidents", "metadata"});
  Campaign c;
  if (const Json* v = findMember(j, "schema_version")) {
    const std::int64_t version = json::asInteger(*v, "schema_version");
    if (version != 1)
      fail("schema_version", "unsupported version " + std::to_string(version) + " (this build reads 1)");
  }
  c.name_ = json::asIdentifier(requireMember(j, "", "name"), "name");
  c.seed_ = parseSeed(doc);
  if (const Json* clock = findMember(j, "clock")) {
    json::requireKnownKeys(*clock, "clock", {"type", "origin"});
    if (const Json* type = findMember(*clock, "type");
        type && json::asString(*type, "clock.type") != "training_iteration") {
      fail("clock.type", "unknown value " + json::describe(*type) + " (allowed: training_iteration)");
    }
    if (const Json* origin = findMember(*clock, "origin")) {
      c.origin_ = parseEnum<ClockOrigin>(*origin, "clock.origin", parseClockOrigin, "training_run, campaign_start");
    }
  }
  const Json& incidents = requireMember(j, "", "incidents");
  if (!incidents.is_array() || incidents.empty()) fail("incidents", "must be a non-empty array of incident objects");
  std::set<std::string> ids;
  for (std::size_t i = 0; i < incidents.size(); ++i) {
    Incident inc = parseIncident(incidents[i], item("incidents", i));
    if (!ids.insert(inc.incident_id).second) {
      fail(child(item("incidents", i), "incident_id"), "duplicate incident_id \"" + inc.incident_id + "\"");
    }
    c.incidents_.push_back(std::move(inc));
  }
  c.metadata_ = objectOrEmpty(j, "", "metadata");
  c.canonical_ = c.serialize(-1);
  c.identity_ = "sha256:" + sha256Hex(c.canonical_);
  return c;
}

const Incident* Campaign::findIncident(std::string_view incident_id) const {
  for (const Incident& inc : incidents_)
    if (inc.incident_id == incident_id) return &inc;
  return nullptr;
}

}  // namespace lmr::campaign
