#include "lmr/ckpt/manifest.h"

#include <set>

#include "lmr/common/error.h"
#include "lmr/common/files.h"
#include "lmr/common/json.h"
#include "names.h"

namespace lmr::ckpt {
namespace {

using json::Json;

constexpr const char* kKind = "lmr.checkpoint_manifest";
constexpr TrustState kStates[] = {TrustState::kLatest, TrustState::kCandidate, TrustState::kRecoveryVerified,
                                  TrustState::kRejected};
constexpr Tier kTiers[] = {Tier::kDurable, Tier::kLatest};

using detail::parseName;

Json checkpointJson(const Checkpoint& c) {
  return Json{{"id", c.id},
              {"step", c.step},
              {"tier", name(c.tier)},
              {"state", name(c.state)},
              {"location", c.location},
              {"topology", c.topology},
              {"reason", c.reason},
              {"certified_at", c.certified_at}};
}

Checkpoint parseCheckpoint(const Json& v, const std::string& path) {
  json::requireObject(v, path);
  json::requireKnownKeys(v, path, {"id", "step", "tier", "state", "location", "topology", "reason", "certified_at"});
  Checkpoint c;
  c.id = json::asIdentifier(json::requireMember(v, path, "id"), json::child(path, "id"));
  c.step = json::asNonNegativeInteger(json::requireMember(v, path, "step"), json::child(path, "step"));
  c.tier = parseName(json::requireMember(v, path, "tier"), json::child(path, "tier"), kTiers);
  c.state = parseName(json::requireMember(v, path, "state"), json::child(path, "state"), kStates);
  c.location = json::asString(json::requireMember(v, path, "location"), json::child(path, "location"));
  c.topology = json::asString(json::requireMember(v, path, "topology"), json::child(path, "topology"));
  c.reason = json::asString(json::requireMember(v, path, "reason"), json::child(path, "reason"));
  c.certified_at = json::asInteger(json::requireMember(v, path, "certified_at"), json::child(path, "certified_at"));
  if (c.certified_at < -1) json::fail(json::child(path, "certified_at"), "must be -1 or a step");
  return c;
}

Json decisionJson(const RecoveryDecision& d) {
  return Json{{"mode", d.mode},
              {"source", d.source},
              {"failure", d.failure},
              {"decided_at", d.decided_at},
              {"decided_time", d.decided_time},
              {"step", d.step},
              {"checkpoint_id", d.checkpoint_id},
              {"location", d.location},
              {"tier", d.tier},
              {"topology", d.topology},
              {"available", d.available},
              {"reason", d.reason},
              {"status", d.status},
              {"restart", d.restart},
              {"action", d.action},
              {"blamed_ranks", d.blamed_ranks},
              {"blamed_hosts", d.blamed_hosts}};
}

RecoveryDecision parseDecisionValue(const Json& v, const std::string& path) {
  json::requireObject(v, path);
  json::requireKnownKeys(
      v, path,
      {"mode", "source", "failure", "decided_at", "decided_time", "step", "checkpoint_id", "location", "tier",
       "topology", "available", "reason", "status", "restart", "action", "blamed_ranks", "blamed_hosts"});
  auto str = [&](std::string_view key) {
    return json::asString(json::requireMember(v, path, key), json::child(path, key));
  };
  RecoveryDecision d;
  d.mode = str("mode");
  if (d.mode != "rollback_verified" && d.mode != "resume_latest" && d.mode != "unavailable")
    json::fail(json::child(path, "mode"),
               "unknown mode \"" + d.mode + "\" (expected rollback_verified, resume_latest or unavailable)");
  d.source = str("source");
  d.failure = str("failure");
  d.decided_at =
      json::asNonNegativeInteger(json::requireMember(v, path, "decided_at"), json::child(path, "decided_at"));
  d.decided_time = json::asNumber(json::requireMember(v, path, "decided_time"), json::child(path, "decided_time"));
  d.step = json::asInteger(json::requireMember(v, path, "step"), json::child(path, "step"));
  d.checkpoint_id = str("checkpoint_id");
  d.location = str("location");
  d.tier = str("tier");
  d.topology = str("topology");
  d.available = json::asBoolean(json::requireMember(v, path, "available"), json::child(path, "available"));
  d.reason = str("reason");
  d.status = str("status");
  if (d.status != "pending" && d.status != "applied")
    json::fail(json::child(path, "status"), "unknown status \"" + d.status + "\" (expected pending or applied)");
  if (d.available != (d.mode != "unavailable"))
    json::fail(json::child(path, "available"), "disagrees with mode \"" + d.mode + "\"");
  if (d.available && (d.step < 0 || d.checkpoint_id.empty()))
    json::fail(path, "an available decision needs a checkpoint_id and a step >= 0");
  d.restart =
      v.contains("restart") ? json::asBoolean(v.at("restart"), json::child(path, "restart")) : d.failure == "sdc";
  if (const Json* a = json::findMember(v, "action")) {
    d.action = json::asString(*a, json::child(path, "action"));
    if (d.action != "rollback" && d.action != "exclude_and_rollback" && d.action != "escalate")
      json::fail(json::child(path, "action"),
                 "unknown action \"" + d.action + "\" (expected rollback, exclude_and_rollback or escalate)");
  }
  if (const Json* r = json::findMember(v, "blamed_ranks")) {
    const std::string at = json::child(path, "blamed_ranks");
    if (!r->is_array()) json::fail(at, "must be an array, got " + json::describe(*r));
    for (std::size_t i = 0; i < r->size(); ++i)
      d.blamed_ranks.push_back(json::asNonNegativeInteger((*r)[i], json::item(at, i)));
  }
  if (const Json* h = json::findMember(v, "blamed_hosts")) {
    const std::string at = json::child(path, "blamed_hosts");
    if (!h->is_array()) json::fail(at, "must be an array, got " + json::describe(*h));
    for (std::size_t i = 0; i < h->size(); ++i) d.blamed_hosts.push_back(json::asString((*h)[i], json::item(at, i)));
  }
  return d;
}

}  // namespace

std::string_view name(TrustState state) noexcept {
  switch (state) {
    case TrustState::kLatest: return "LATEST";
    case TrustState::kCandidate: return "CANDIDATE";
    case TrustState::kRecoveryVerified: return "RECOVERY_VERIFIED";
    case TrustState::kRejected: return "REJECTED";
  }
  return "?";
}

std::string_view name(Tier tier) noexcept { return tier == Tier::kDurable ? "durable" : "latest"; }

TrustState parseTrustState(std::string_view text) {
  if (auto v = detail::fromName(text, kStates)) return *v;
  throw InvalidArgument("unknown trust state \"" + std::string(text) + "\" (expected " + detail::namesOf(kStates) +
                        ")");
}

Tier parseTier(std::string_view text) {
  if (auto v = detail::fromName(text, kTiers)) return *v;
  throw InvalidArgument("unknown tier \"" + std::string(text) + "\" (expected " + detail::namesOf(kTiers) + ")");
}

Checkpoint* Manifest::find(std::string_view id) {
  for (auto& c : checkpoints)
    if (c.id == id) return &c;
  return nullptr;
}

const Checkpoint* Manifest::find(std::string_view id) const { return const_cast<Manifest*>(this)->find(id); }

void Manifest::setDecision(RecoveryDecision d) {
  if (decision && !(*decision == d)) {
    history.push_back(std::move(*decision));
    if (history.size() > kDecisionHistory) history.erase(history.begin());
  }
  decision = std::move(d);
}

std::string toJson(const Manifest& m, int indent) {
  Json checkpoints = Json::array(), history = Json::array();
  for (const auto& c : m.checkpoints) checkpoints.push_back(checkpointJson(c));
  for (const auto& d : m.history) history.push_back(decisionJson(d));
  Json doc{{"schema_version", kManifestSchemaVersion},
           {"kind", kKind},
           {"topology", m.topology},
           {"generation", m.generation},
           {"tainted_since", m.tainted_since ? Json(*m.tainted_since) : Json(nullptr)},
           {"checkpoints", checkpoints},
           {"decision", m.decision ? decisionJson(*m.decision) : Json(nullptr)},
           {"history", history}};
  return doc.dump(indent);
}

Manifest parseManifest(std::string_view text, std::string_view source) {
  const Json v = json::parse(text, source).value;
  const std::string root;
  json::requireObject(v, root);
  const std::int64_t version = json::asInteger(json::requireMember(v, root, "schema_version"), "schema_version");
  if (version != 1 && version != kManifestSchemaVersion)
    json::fail("schema_version", "unsupported version " + std::to_string(version) + " (this build reads 1 to " +
                                     std::to_string(kManifestSchemaVersion) + ")");
  if (version == 1)
    json::requireKnownKeys(
        v, root, {"schema_version", "kind", "topology", "generation", "tainted_since", "checkpoints", "decision"});
  else
    json::requireKnownKeys(
        v, root,
        {"schema_version", "kind", "topology", "generation", "tainted_since", "checkpoints", "decision", "history"});
  if (json::asString(json::requireMember(v, root, "kind"), "kind") != kKind)
    json::fail("kind", std::string("expected \"") + kKind + "\"");
  Manifest m;
  m.topology = json::asString(json::requireMember(v, root, "topology"), "topology");
  m.generation = json::asNonNegativeInteger(json::requireMember(v, root, "generation"), "generation");
  const Json& tainted = json::requireMember(v, root, "tainted_since");
  if (!tainted.is_null()) m.tainted_since = json::asNonNegativeInteger(tainted, "tainted_since");
  const Json& list = json::requireMember(v, root, "checkpoints");
  if (!list.is_array()) json::fail("checkpoints", "must be an array, got " + json::describe(list));
  std::set<std::string> ids;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string path = json::item("checkpoints", i);
    Checkpoint c = parseCheckpoint(list[i], path);
    if (!ids.insert(c.id).second) json::fail(json::child(path, "id"), "duplicate checkpoint id \"" + c.id + "\"");
    if (!m.checkpoints.empty() && c.step < m.checkpoints.back().step)
      json::fail(json::child(path, "step"), "steps must not decrease (" + std::to_string(c.step) + " after " +
                                                std::to_string(m.checkpoints.back().step) + ")");
    m.checkpoints.push_back(std::move(c));
  }
  const Json& decision = json::requireMember(v, root, "decision");
  if (!decision.is_null()) m.decision = parseDecisionValue(decision, "decision");
  if (version >= 2) {
    const Json& history = json::requireMember(v, root, "history");
    if (!history.is_array()) json::fail("history", "must be an array, got " + json::describe(history));
    for (std::size_t i = 0; i < history.size(); ++i)
      m.history.push_back(parseDecisionValue(history[i], json::item("history", i)));
  }
  return m;
}

std::string toJson(const RecoveryDecision& decision, int indent) { return decisionJson(decision).dump(indent); }

RecoveryDecision parseDecision(std::string_view text, std::string_view source) {
  return parseDecisionValue(json::parse(text, source).value, "");
}

std::string manifestPath(const std::string& directory) { return directory + "/lmr-trust-manifest.json"; }

void writeManifest(const std::string& directory, const Manifest& manifest) {
  detail::writeDocument(directory, manifestPath(directory), toJson(manifest));
}

std::optional<Manifest> readManifest(const std::string& directory) {
  const std::string path = manifestPath(directory);
  auto text = files::readFile(path);
  if (!text) return std::nullopt;
  return parseManifest(*text, path);
}

}  // namespace lmr::ckpt
