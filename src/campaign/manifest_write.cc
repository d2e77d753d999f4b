// Canonical serialization of manifests. Keys are sorted (nlohmann objects are ordered maps)
// and every default is written, so the text, and the identity hashed from it, depend only
// on what the manifest means.
#include "lmr/campaign/manifest.h"

namespace lmr::campaign {
namespace {

Json triggerToJson(const Trigger& t) {
  Json j = Json::object();
  if (t.is_range) {
    j["range"] = Json{{"start", t.start}, {"end", t.end}, {"every", t.every}};
  } else {
    j["at"] = t.at;
  }
  j["probability"] = t.probability;
  return j;
}

Json lifetimeToJson(const Lifetime& l) {
  switch (l.kind) {
    case LifetimeKind::kMatchingCalls: return Json{{"matching_calls", l.count}};
    case LifetimeKind::kIterations: return Json{{"iterations", l.count}};
    case LifetimeKind::kUntil: return Json{{"until", std::string(name(l.until))}};
  }
  return Json::object();
}

Json incidentToJson(const Incident& inc) {
  Json faults = Json::array();
  for (const Fault& f : inc.faults) {
    faults.push_back(Json{{"fault_id", f.fault_id},
                          {"type", std::string(name(f.type))},
                          {"target", targetToJson(f.target)},
                          {"parameters", f.parameters}});
  }
  Json j{{"incident_id", inc.incident_id},
         {"trigger", triggerToJson(inc.trigger)},
         {"lifetime", lifetimeToJson(inc.lifetime)},
         {"retrigger", std::string(name(inc.retrigger))},
         {"faults", faults}};
  if (inc.retrigger == Retrigger::kMaxOccurrences) j["max_occurrences"] = inc.max_occurrences;
  return j;
}

}  // namespace

Json targetToJson(const Target& t) {
  Json j{{"surface", std::string(name(t.surface))}, {"model_part", t.model_part}, {"metadata", t.metadata}};
  // `rank` stays absent when it was absent: a resource-only target expects no rank.
  if (t.rank) j["rank"] = *t.rank;
  if (t.component) j["component"] = *t.component;
  if (t.index) j["index"] = *t.index;
  if (t.module_path) j["module_path"] = *t.module_path;
  if (t.operation) j["operation"] = *t.operation;
  if (t.resource) j["resource"] = *t.resource;
  if (t.path) j["path"] = *t.path;
  if (t.host) j["host"] = *t.host;
  if (t.local_rank) j["local_rank"] = *t.local_rank;
  return j;
}

Json Campaign::toJsonValue() const {
  Json incidents = Json::array();
  for (const Incident& inc : incidents_) incidents.push_back(incidentToJson(inc));
  Json j{{"schema_version", 1},
         {"name", name_},
         {"clock", Json{{"type", "training_iteration"}, {"origin", std::string(campaign::name(origin_))}}},
         {"incidents", incidents},
         {"metadata", metadata_}};
  const Int128 int64_min = -(static_cast<Int128>(1) << 63);
  const Int128 int64_max = (static_cast<Int128>(1) << 63) - 1;
  if (seed_ >= int64_min && seed_ <= int64_max) {
    j["seed"] = static_cast<std::int64_t>(seed_);
  } else {
    j["seed"] = json::int128ToString(seed_);
  }
  return j;
}

std::string Campaign::serialize(int indent) const {
  Json j = toJsonValue();
  j.erase("seed");
  return json::dumpWithRawMember(std::move(j), "seed", json::int128ToString(seed_), indent);
}

std::string Campaign::toJson(int indent) const { return serialize(indent); }

}  // namespace lmr::campaign
