#include "lmr/ckpt/exclusion.h"

#include <algorithm>
#include <array>
#include <set>

#include "lmr/common/error.h"
#include "lmr/common/files.h"
#include "lmr/common/json.h"
#include "names.h"

namespace lmr::ckpt {
namespace {

using json::Json;

constexpr const char* kLedgerKind = "lmr.exclusions";
constexpr BlameKind kKinds[] = {BlameKind::kSdc, BlameKind::kComputeStraggler, BlameKind::kCommStraggler,
                                BlameKind::kHealth, BlameKind::kHang};
constexpr Action kActions[] = {Action::kRollback, Action::kExcludeAndRollback, Action::kEscalate, Action::kWarn};

using detail::parseName;

std::vector<std::string> strings(const Json& v, const std::string& path) {
  if (!v.is_array()) json::fail(path, "must be an array, got " + json::describe(v));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(json::asString(v[i], json::item(path, i)));
  return out;
}

std::vector<std::int64_t> integers(const Json& v, const std::string& path) {
  if (!v.is_array()) json::fail(path, "must be an array, got " + json::describe(v));
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(json::asNonNegativeInteger(v[i], json::item(path, i)));
  return out;
}

Json blameJson(const Blame& b) {
  return Json{{"kind", name(b.kind)}, {"ranks", b.ranks},           {"hosts", b.hosts},         {"sources", b.sources},
              {"step", b.step},       {"generation", b.generation}, {"confirmed", b.confirmed}, {"fatal", b.fatal}};
}

Blame parseBlame(const Json& v, const std::string& path) {
  json::requireObject(v, path);
  json::requireKnownKeys(v, path, {"kind", "ranks", "hosts", "sources", "step", "generation", "confirmed", "fatal"});
  auto member = [&](std::string_view key) -> const Json& { return json::requireMember(v, path, key); };
  Blame b;
  b.kind = parseName(member("kind"), json::child(path, "kind"), kKinds);
  b.ranks = integers(member("ranks"), json::child(path, "ranks"));
  b.hosts = strings(member("hosts"), json::child(path, "hosts"));
  b.sources = strings(member("sources"), json::child(path, "sources"));
  b.step = json::asNonNegativeInteger(member("step"), json::child(path, "step"));
  b.generation = json::asNonNegativeInteger(member("generation"), json::child(path, "generation"));
  b.confirmed = json::asBoolean(member("confirmed"), json::child(path, "confirmed"));
  b.fatal = json::asBoolean(member("fatal"), json::child(path, "fatal"));
  return b;
}

Json decisionJson(const ExclusionDecision& d) {
  return Json{{"action", name(d.action)}, {"kind", name(d.kind)},       {"hosts", d.hosts},
              {"exclude", d.exclude},     {"occurrence", d.occurrence}, {"reason", d.reason}};
}

ExclusionDecision parseExclusionDecision(const Json& v, const std::string& path) {
  json::requireObject(v, path);
  json::requireKnownKeys(v, path, {"action", "kind", "hosts", "exclude", "occurrence", "reason"});
  auto member = [&](std::string_view key) -> const Json& { return json::requireMember(v, path, key); };
  ExclusionDecision d;
  d.action = parseName(member("action"), json::child(path, "action"), kActions);
  d.kind = parseName(member("kind"), json::child(path, "kind"), kKinds);
  d.hosts = strings(member("hosts"), json::child(path, "hosts"));
  d.exclude = strings(member("exclude"), json::child(path, "exclude"));
  d.occurrence = json::asNonNegativeInteger(member("occurrence"), json::child(path, "occurrence"));
  d.reason = json::asString(member("reason"), json::child(path, "reason"));
  return d;
}

Json excludedJson(const ExcludedHost& e) {
  return Json{{"host", e.host}, {"kind", name(e.kind)},       {"ranks", e.ranks},
              {"step", e.step}, {"generation", e.generation}, {"reason", e.reason}};
}

ExcludedHost parseExcluded(const Json& v, const std::string& path) {
  json::requireObject(v, path);
  json::requireKnownKeys(v, path, {"host", "kind", "ranks", "step", "generation", "reason"});
  auto member = [&](std::string_view key) -> const Json& { return json::requireMember(v, path, key); };
  ExcludedHost e;
  e.host = json::asString(member("host"), json::child(path, "host"));
  if (e.host.empty()) json::fail(json::child(path, "host"), "must not be empty");
  e.kind = parseName(member("kind"), json::child(path, "kind"), kKinds);
  e.ranks = integers(member("ranks"), json::child(path, "ranks"));
  e.step = json::asNonNegativeInteger(member("step"), json::child(path, "step"));
  e.generation = json::asNonNegativeInteger(member("generation"), json::child(path, "generation"));
  e.reason = json::asString(member("reason"), json::child(path, "reason"));
  return e;
}

void requirePolicy(const RecoveryPolicy& p) {
  auto atLeast = [](std::int64_t v, std::int64_t min, const char* field) {
    if (v < min)
      throw InvalidArgument(std::string("policy.") + field + " must be >= " + std::to_string(min) + ", got " +
                            std::to_string(v));
  };
  atLeast(p.sdc_exclude_after, 1, "sdc_exclude_after");
  atLeast(p.straggler_exclude_after, 1, "straggler_exclude_after");
  atLeast(p.hang_exclude_after, 1, "hang_exclude_after");
  atLeast(p.max_excluded, 0, "max_excluded");
  atLeast(p.min_nodes, 1, "min_nodes");
  atLeast(p.max_identical, 2, "max_identical");
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

template <typename T>
bool overlap(const std::vector<T>& a, const std::vector<T>& b) {
  return std::any_of(a.begin(), a.end(), [&](const T& x) { return std::find(b.begin(), b.end(), x) != b.end(); });
}

// How many confirmed blames of `blame`'s kind in `history` name any of its hosts (or, where the
// hosts are unknown, any of its ranks among blames without hosts).
std::int64_t occurrences(const std::vector<Blame>& history, const Blame& blame) {
  std::int64_t n = 0;
  for (const auto& b : history) {
    if (b.kind != blame.kind || !b.confirmed) continue;
    const bool same =
        blame.hosts.empty() ? b.hosts.empty() && overlap(b.ranks, blame.ranks) : overlap(b.hosts, blame.hosts);
    n += same ? 1 : 0;
  }
  return n;
}

// What the policy asks for this blame before the limits: exclude, or the action short of it.
struct Wish {
  bool exclude = false;
  Action otherwise = Action::kRollback;
  std::string why;
};

Wish wish(const RecoveryPolicy& p, const Blame& b, std::int64_t n) {
  const std::string nth = std::to_string(n);
  switch (b.kind) {
    case BlameKind::kSdc:
      return {n >= p.sdc_exclude_after, Action::kRollback,
              "SDC attributed to the same host " + nth + " time(s); the policy excludes at " +
                  std::to_string(p.sdc_exclude_after)};
    case BlameKind::kComputeStraggler:
    case BlameKind::kCommStraggler:
      if (!p.straggler_exclude) return {false, Action::kWarn, "a confirmed straggler: the policy warns"};
      return {n >= p.straggler_exclude_after, Action::kWarn,
              "a confirmed straggler on the same host " + nth + " time(s); the policy excludes at " +
                  std::to_string(p.straggler_exclude_after)};
    case BlameKind::kHealth:
      if (b.fatal && p.health_fatal_exclude) return {true, Action::kRollback, "a fatal health event"};
      return {false, Action::kWarn, b.fatal ? "a fatal health event: the policy warns" : "a health event"};
    case BlameKind::kHang:
      return {n >= p.hang_exclude_after, Action::kRollback,
              "a hang or stall blamed on the same host " + nth + " time(s); the policy excludes at " +
                  std::to_string(p.hang_exclude_after)};
  }
  return {};
}

// The same decision (action, kind, hosts) this many times in a row at the end of `decisions`.
std::int64_t repeats(const std::vector<ExclusionDecision>& decisions, const ExclusionDecision& d) {
  std::int64_t n = 0;
  for (auto it = decisions.rbegin(); it != decisions.rend(); ++it) {
    if (it->action != d.action || it->kind != d.kind || it->hosts != d.hosts) break;
    ++n;
  }
  return n;
}

}  // namespace

std::string_view name(BlameKind kind) noexcept {
  switch (kind) {
    case BlameKind::kSdc: return "sdc";
    case BlameKind::kComputeStraggler: return "compute_straggler";
    case BlameKind::kCommStraggler: return "comm_straggler";
    case BlameKind::kHealth: return "health";
    case BlameKind::kHang: return "hang";
  }
  return "?";
}

BlameKind parseBlameKind(std::string_view text) {
  if (auto v = detail::fromName(text, kKinds)) return *v;
  throw InvalidArgument("unknown blame kind \"" + std::string(text) + "\" (expected " + detail::namesOf(kKinds) + ")");
}

std::string_view name(Action action) noexcept {
  switch (action) {
    case Action::kRollback: return "rollback";
    case Action::kExcludeAndRollback: return "exclude_and_rollback";
    case Action::kEscalate: return "escalate";
    case Action::kWarn: return "warn";
  }
  return "?";
}

RecoveryPolicy parsePolicy(std::string_view text, std::string_view source) {
  const Json v = json::parse(text, source).value;
  const std::string root;
  json::requireObject(v, root);
  json::requireKnownKeys(
      v, root,
      {"sdc_exclude_after", "straggler_exclude", "straggler_exclude_after", "health_fatal_exclude",
       "hang_exclude_after", "max_excluded", "min_nodes", "max_identical", "in_process", "hang_relaunch"});
  RecoveryPolicy p;
  auto integer = [&](std::string_view key, std::int64_t& field) {
    if (const Json* m = json::findMember(v, key)) field = json::asInteger(*m, std::string(key));
  };
  auto boolean = [&](std::string_view key, bool& field) {
    if (const Json* m = json::findMember(v, key)) field = json::asBoolean(*m, std::string(key));
  };
  integer("sdc_exclude_after", p.sdc_exclude_after);
  boolean("straggler_exclude", p.straggler_exclude);
  integer("straggler_exclude_after", p.straggler_exclude_after);
  boolean("health_fatal_exclude", p.health_fatal_exclude);
  integer("hang_exclude_after", p.hang_exclude_after);
  integer("max_excluded", p.max_excluded);
  integer("min_nodes", p.min_nodes);
  integer("max_identical", p.max_identical);
  boolean("in_process", p.in_process);
  boolean("hang_relaunch", p.hang_relaunch);
  requirePolicy(p);
  return p;
}

std::string toJson(const RecoveryPolicy& p, int indent) {
  return Json{{"sdc_exclude_after", p.sdc_exclude_after},
              {"straggler_exclude", p.straggler_exclude},
              {"straggler_exclude_after", p.straggler_exclude_after},
              {"health_fatal_exclude", p.health_fatal_exclude},
              {"hang_exclude_after", p.hang_exclude_after},
              {"max_excluded", p.max_excluded},
              {"min_nodes", p.min_nodes},
              {"max_identical", p.max_identical},
              {"in_process", p.in_process},
              {"hang_relaunch", p.hang_relaunch}}
      .dump(indent);
}

bool ExclusionLedger::isExcluded(std::string_view host) const {
  return std::any_of(excluded.begin(), excluded.end(), [&](const ExcludedHost& e) { return e.host == host; });
}

CulpritResponse respondTo(const ExclusionDecision& e, bool fatal) {
  CulpritResponse r;
  switch (e.kind) {
    case BlameKind::kSdc: r.failure = Failure::kSdc; break;
    case BlameKind::kComputeStraggler:
    case BlameKind::kCommStraggler: r.failure = Failure::kStraggler; break;
    case BlameKind::kHealth: r.failure = Failure::kInaccessible; break;
    case BlameKind::kHang: r.failure = Failure::kHang; break;
  }
  const bool hang = e.kind == BlameKind::kHang;
  r.leave = !hang && (e.action == Action::kExcludeAndRollback ||
                      (e.action == Action::kEscalate && e.kind == BlameKind::kHealth && fatal));
  return r;
}

bool rollsBackInProcess(const RecoveryDecision& d, const RecoveryPolicy& policy) {
  return policy.in_process && d.available && d.restart && d.action == "rollback" &&
         (d.failure == "sdc" || d.failure == "straggler");
}

bool endsHang(std::string_view kind, const RecoveryPolicy& policy) {
  static constexpr std::array<std::string_view, 5> kStuck = {"process_stall", "collective_desync", "unresponsive_rank",
                                                             "group_stall", "inconclusive_stall"};
  return policy.hang_relaunch && std::find(kStuck.begin(), kStuck.end(), kind) != kStuck.end();
}

bool readmit(ExclusionLedger& ledger, std::string_view host) {
  return std::erase_if(ledger.excluded, [&](const ExcludedHost& e) { return e.host == host; }) > 0;
}

std::string toJson(const ExclusionLedger& ledger, int indent) {
  Json history = Json::array(), decisions = Json::array(), excluded = Json::array();
  for (const auto& b : ledger.history) history.push_back(blameJson(b));
  for (const auto& d : ledger.decisions) decisions.push_back(decisionJson(d));
  for (const auto& e : ledger.excluded) excluded.push_back(excludedJson(e));
  return Json{{"schema_version", kExclusionSchemaVersion},
              {"kind", kLedgerKind},
              {"history", history},
              {"decisions", decisions},
              {"excluded", excluded}}
      .dump(indent);
}

ExclusionLedger parseLedger(std::string_view text, std::string_view source) {
  const Json v = json::parse(text, source).value;
  const std::string root;
  json::requireObject(v, root);
  json::requireKnownKeys(v, root, {"schema_version", "kind", "history", "decisions", "excluded"});
  const std::int64_t version = json::asInteger(json::requireMember(v, root, "schema_version"), "schema_version");
  if (version != kExclusionSchemaVersion)
    json::fail("schema_version", "unsupported version " + std::to_string(version) + " (this build reads " +
                                     std::to_string(kExclusionSchemaVersion) + ")");
  if (json::asString(json::requireMember(v, root, "kind"), "kind") != kLedgerKind)
    json::fail("kind", std::string("expected \"") + kLedgerKind + "\"");
  ExclusionLedger ledger;
  auto each = [&](const char* key, auto parse) {
    const Json& list = json::requireMember(v, root, key);
    if (!list.is_array()) json::fail(key, "must be an array, got " + json::describe(list));
    for (std::size_t i = 0; i < list.size(); ++i) parse(list[i], json::item(key, i));
  };
  each("history", [&](const Json& x, const std::string& p) { ledger.history.push_back(parseBlame(x, p)); });
  each("decisions",
       [&](const Json& x, const std::string& p) { ledger.decisions.push_back(parseExclusionDecision(x, p)); });
  std::set<std::string> hosts;
  each("excluded", [&](const Json& x, const std::string& p) {
    ExcludedHost e = parseExcluded(x, p);
    if (!hosts.insert(e.host).second) json::fail(json::child(p, "host"), "host \"" + e.host + "\" is listed twice");
    ledger.excluded.push_back(std::move(e));
  });
  if (ledger.decisions.size() != ledger.history.size())
    json::fail("decisions", "has " + std::to_string(ledger.decisions.size()) + " entries for " +
                                std::to_string(ledger.history.size()) + " in history");
  return ledger;
}

std::string ledgerPath(const std::string& directory) { return directory + "/lmr-exclusions.json"; }

void writeLedger(const std::string& directory, const ExclusionLedger& ledger) {
  detail::writeDocument(directory, ledgerPath(directory), toJson(ledger));
}

ExclusionLedger readLedger(const std::string& directory) {
  const std::string path = ledgerPath(directory);
  auto text = files::readFile(path);
  return text ? parseLedger(*text, path) : ExclusionLedger{};
}

ExclusionDecision decideExclusion(const RecoveryPolicy& policy, ExclusionLedger& ledger, const Blame& blame,
                                  std::int64_t nodes) {
  requirePolicy(policy);
  if (blame.ranks.empty()) throw InvalidArgument("a blame needs the blamed ranks");
  if (nodes < 1) throw InvalidArgument("the job runs on at least one node, got " + std::to_string(nodes));
  for (const auto& h : blame.hosts)
    if (ledger.isExcluded(h)) throw InvalidArgument("host \"" + h + "\" is blamed but was already excluded");

  ExclusionDecision d;
  d.kind = blame.kind;
  d.hosts = blame.hosts;
  std::vector<Blame> with = ledger.history;
  with.push_back(blame);
  d.occurrence = blame.confirmed ? occurrences(with, blame) : 0;
  const Wish w = wish(policy, blame, d.occurrence);
  const bool excludes = blame.confirmed && w.exclude;
  if (!blame.confirmed) {
    d.action = blame.kind == BlameKind::kSdc || blame.kind == BlameKind::kHang ? Action::kRollback : Action::kWarn;
    d.reason = "inconclusive evidence never excludes a host";
  } else if (!excludes) {
    d.action = w.otherwise;
    d.reason = w.why;
  } else {
    const auto excluded_now = static_cast<std::int64_t>(ledger.excluded.size());
    const auto hosts = static_cast<std::int64_t>(blame.hosts.size());
    if (hosts == 0) {
      d.action = Action::kEscalate;
      d.reason = w.why + ", but the blamed ranks' hosts are unknown: nothing can be excluded";
    } else if (excluded_now + hosts > policy.max_excluded) {
      d.action = Action::kEscalate;
      d.reason = w.why + ", but excluding " + joined(blame.hosts) +
                 " would exceed max_excluded=" + std::to_string(policy.max_excluded) + " (" +
                 std::to_string(excluded_now) + " excluded already)";
    } else if (nodes - hosts < policy.min_nodes) {
      d.action = Action::kEscalate;
      d.reason = w.why + ", but excluding " + joined(blame.hosts) + " would leave " + std::to_string(nodes - hosts) +
                 " node(s), fewer than min_nodes=" + std::to_string(policy.min_nodes);
    } else {
      d.action = Action::kExcludeAndRollback;
      d.exclude = blame.hosts;
      d.reason = w.why + ": excluding " + joined(blame.hosts);
    }
  }
  // A loop guard: the same rollback for the same culprit again and again heals nothing.
  if (d.action == Action::kRollback && repeats(ledger.decisions, d) + 1 >= policy.max_identical) {
    d.action = Action::kEscalate;
    d.reason += "; the same rollback for the same culprit " + std::to_string(policy.max_identical) +
                " times in a row: escalating instead of rolling back again";
  }
  ledger.history.push_back(blame);
  ledger.decisions.push_back(d);
  for (const auto& h : d.exclude)
    ledger.excluded.push_back(ExcludedHost{h, blame.kind, blame.ranks, blame.step, blame.generation, d.reason});
  return d;
}

void applyExclusion(RecoveryDecision& decision, const ExclusionDecision& exclusion, const Blame& blame,
                    const Manifest& manifest, bool fast_tier_survives) {
  if (exclusion.action == Action::kWarn) return;
  Action action = exclusion.action;
  std::string reason = exclusion.reason;
  if (action == Action::kExcludeAndRollback && decision.available && decision.tier == name(Tier::kLatest) &&
      !fast_tier_survives) {
    RecoveryDecision durable = selectRecovery(manifest, parseFailure(decision.failure), decision.decided_at,
                                              EmergencyReplay::kNotRun, decision.decided_time, true);
    if (durable.available) {
      durable.restart = decision.restart;
      decision = std::move(durable);
    } else {
      action = Action::kEscalate;
      reason += "; but no durable RECOVERY_VERIFIED checkpoint exists to resume on other nodes";
    }
  }
  decision.action = std::string(name(action));
  decision.blamed_ranks = blame.ranks;
  decision.blamed_hosts = blame.hosts;
  decision.reason += "; " + reason;
  if (action == Action::kEscalate) decision.restart = false;
  if (action == Action::kExcludeAndRollback) decision.restart = true;  // the node leaves only with its ranks
}

}  // namespace lmr::ckpt
