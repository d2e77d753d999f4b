#include "lmr/campaign/evaluate.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "lmr/common/error.h"

namespace lmr::campaign {
namespace {

using json::child;
using json::fail;
using json::findMember;
using json::item;

// A localization target: (rank, resource), either may be absent.
using TargetKey = std::pair<std::optional<std::int64_t>, std::optional<std::string>>;

template <typename T>
std::vector<T> sortedUnique(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::string describeTarget(const TargetKey& t) {
  std::string s = "(";
  s += t.first ? "rank " + std::to_string(*t.first) : "no rank";
  s += ", ";
  s += t.second ? "resource " + *t.second : "no resource";
  return s + ")";
}

// The targets a result names: every (rank, resource) pair it reports.
std::set<TargetKey> targetsOf(const LocalizationResult& r) {
  std::set<TargetKey> out;
  std::vector<std::optional<std::int64_t>> ranks;
  std::vector<std::optional<std::string>> resources;
  for (auto x : r.failed_ranks) ranks.emplace_back(x);
  for (auto& x : r.failed_resources) resources.emplace_back(x);
  if (ranks.empty()) ranks.emplace_back(std::nullopt);
  if (resources.empty()) resources.emplace_back(std::nullopt);
  for (auto& a : ranks)
    for (auto& b : resources)
      if (a || b) out.emplace(a, b);
  return out;
}

struct Expectation {
  TargetKey target;
  std::string kind;
  std::optional<std::string> component;
  std::optional<std::int64_t> layer;
};

// Checks that `results` localize exactly `actions`: rank and resource sets, and the pairing
// of actions that name both. Appends reasons (prefixed by `scope`) and returns success.
bool matchTargets(const std::vector<Expectation>& actions, const std::vector<const LocalizationResult*>& results,
                  const std::string& scope, std::vector<std::string>& reasons) {
  std::set<std::int64_t> er, rr;
  std::set<std::string> es, rs;
  std::set<TargetKey> paired;
  for (const Expectation& a : actions) {
    if (a.target.first) er.insert(*a.target.first);
    if (a.target.second) es.insert(*a.target.second);
    if (a.target.first && a.target.second) paired.insert(a.target);
  }
  std::set<TargetKey> reported_pairs;
  for (const LocalizationResult* r : results) {
    rr.insert(r->failed_ranks.begin(), r->failed_ranks.end());
    rs.insert(r->failed_resources.begin(), r->failed_resources.end());
    for (const TargetKey& t : targetsOf(*r))
      if (t.first && t.second) reported_pairs.insert(t);
  }
  bool ok = true;
  auto list = [](const auto& set) {
    std::string s = "[";
    for (const auto& x : set) {
      if (s.size() > 1) s += ", ";
      if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) s += x;
      else s += std::to_string(x);
    }
    return s + "]";
  };
  if (rr != er) {
    reasons.push_back(scope + "reported ranks " + list(rr) + ", expected " + list(er));
    ok = false;
  }
  if (rs != es) {
    reasons.push_back(scope + "reported resources " + list(rs) + ", expected " + list(es));
    ok = false;
  }
  // Each (rank, resource) action must appear as a reported pair, and no reported pair may
  // cross a paired rank or resource with another partner.
  std::set<std::int64_t> paired_ranks;
  std::set<std::string> paired_resources;
  for (const TargetKey& p : paired) {
    paired_ranks.insert(*p.first);
    paired_resources.insert(*p.second);
    if (!reported_pairs.count(p)) {
      reasons.push_back(scope + "no result pairs " + describeTarget(p));
      ok = false;
    }
  }
  for (const TargetKey& p : reported_pairs) {
    if ((paired_ranks.count(*p.first) || paired_resources.count(*p.second)) && !paired.count(p)) {
      reasons.push_back(scope + "reported pair " + describeTarget(p) + " crosses the injected pairing");
      ok = false;
    }
  }
  return ok;
}

// Whether the reported associations (label, target) equal the expected ones, where label
// is derived per result and per action by the given functions. Only results for which
// `result_label` yields labels take part.
template <typename Label>
bool matchAssociations(const std::vector<Expectation>& actions, const std::vector<const LocalizationResult*>& results,
                       const std::function<std::vector<Label>(const LocalizationResult&)>& result_labels,
                       const std::function<std::optional<Label>(const Expectation&)>& action_label,
                       const std::string& what, std::vector<std::string>& reasons) {
  std::set<std::pair<Label, TargetKey>> expected, reported;
  for (const Expectation& a : actions)
    if (auto l = action_label(a)) expected.emplace(*l, a.target);
  bool any = false;
  for (const LocalizationResult* r : results) {
    for (const Label& l : result_labels(*r)) {
      any = true;
      for (const TargetKey& t : targetsOf(*r)) reported.emplace(l, t);
    }
  }
  if (!any || reported == expected) return true;
  reasons.push_back(what + " evidence is not associated with the injected targets");
  return false;
}

}  // namespace

LocalizationResult LocalizationResult::fromJson(const Json& j, const std::string& path) {
  json::requireKnownKeys(j, path,
                         {"occurrence_id", "detected", "failed_ranks", "failed_resources", "kind", "components",
                          "layer_id", "latency_ms", "scope"});
  LocalizationResult r;
  r.occurrence_id = json::asIdentifier(json::requireMember(j, path, "occurrence_id"), child(path, "occurrence_id"));
  r.detected = json::asBoolean(json::requireMember(j, path, "detected"), child(path, "detected"));
  auto stringArray = [&](const Json& v, const std::string& p) {
    if (!v.is_array()) fail(p, "must be an array of non-empty strings, got " + json::describe(v));
    std::vector<std::string> out;
    for (std::size_t i = 0; i < v.size(); ++i) out.push_back(json::asIdentifier(v[i], item(p, i)));
    return sortedUnique(out);
  };
  if (const Json* v = findMember(j, "failed_ranks")) {
    const std::string p = child(path, "failed_ranks");
    if (!v->is_array()) fail(p, "must be an array of ranks, got " + json::describe(*v));
    for (std::size_t i = 0; i < v->size(); ++i)
      r.failed_ranks.push_back(json::asNonNegativeInteger((*v)[i], item(p, i)));
    r.failed_ranks = sortedUnique(r.failed_ranks);
  }
  if (const Json* v = findMember(j, "failed_resources"))
    r.failed_resources = stringArray(*v, child(path, "failed_resources"));
  if (const Json* v = findMember(j, "kind"); v && !v->is_null()) r.kind = json::asIdentifier(*v, child(path, "kind"));
  if (const Json* v = findMember(j, "components"); v && !v->is_null())
    r.components = stringArray(*v, child(path, "components"));
  if (const Json* v = findMember(j, "layer_id"); v && !v->is_null()) {
    r.layer_id = json::asInteger(*v, child(path, "layer_id"));
    if (*r.layer_id < -1) fail(child(path, "layer_id"), "must be a layer index or -1");
  }
  if (const Json* v = findMember(j, "latency_ms"); v && !v->is_null()) {
    r.latency_ms = json::asNumber(*v, child(path, "latency_ms"));
    if (*r.latency_ms < 0) fail(child(path, "latency_ms"), "must be >= 0");
  }
  if (const Json* v = findMember(j, "scope")) r.scope = json::asIdentifier(*v, child(path, "scope"));
  return r;
}

Json LocalizationResult::toJson() const {
  Json j{{"occurrence_id", occurrence_id},
         {"detected", detected},
         {"failed_ranks", failed_ranks},
         {"failed_resources", failed_resources},
         {"scope", scope}};
  j["kind"] = kind ? Json(*kind) : Json(nullptr);
  j["components"] = components ? Json(*components) : Json(nullptr);
  j["layer_id"] = layer_id ? Json(*layer_id) : Json(nullptr);
  j["latency_ms"] = latency_ms ? Json(*latency_ms) : Json(nullptr);
  return j;
}

Json OccurrenceScore::toJson() const {
  return Json{{"occurrence_id", occurrence_id},
              {"incident_id", incident_id},
              {"iteration", iteration},
              {"attempt", attempt},
              {"skipped", skipped},
              {"injection_succeeded", injection_succeeded},
              {"detected", detected},
              {"localized", localized},
              {"expected_ranks", expected_ranks},
              {"expected_resources", expected_resources},
              {"expected_kinds", expected_kinds},
              {"expected_components", expected_components},
              {"latency_ms", latency_ms ? Json(*latency_ms) : Json(nullptr)},
              {"results", results},
              {"reasons", reasons}};
}

std::size_t CampaignReport::scored() const {
  return std::count_if(occurrences.begin(), occurrences.end(), [](const auto& o) { return !o.skipped; });
}
std::size_t CampaignReport::injected() const {
  return std::count_if(occurrences.begin(), occurrences.end(),
                       [](const auto& o) { return !o.skipped && o.injection_succeeded; });
}
std::size_t CampaignReport::detected() const {
  return std::count_if(occurrences.begin(), occurrences.end(), [](const auto& o) { return !o.skipped && o.detected; });
}
std::size_t CampaignReport::localized() const {
  return std::count_if(occurrences.begin(), occurrences.end(), [](const auto& o) { return !o.skipped && o.localized; });
}

std::optional<double> CampaignReport::meanLatencyMs() const {
  double sum = 0;
  std::size_t n = 0;
  for (const auto& o : occurrences)
    if (o.localized && o.latency_ms) {
      sum += *o.latency_ms;
      ++n;
    }
  if (n == 0) return std::nullopt;
  return sum / static_cast<double>(n);
}

Json CampaignReport::totalsJson() const {
  const auto mean = meanLatencyMs();
  return Json{{"occurrences", scored()},
              {"skipped", occurrences.size() - scored()},
              {"injected", injected()},
              {"detected", detected()},
              {"localized", localized()},
              {"unmatched_results", unmatched_results.size()},
              {"mean_latency_ms", mean ? Json(*mean) : Json(nullptr)},
              {"all_localized", allLocalized()}};
}

std::size_t CampaignReport::falseExclusions() const {
  if (!exclusions) return 0;
  return static_cast<std::size_t>(
      std::count_if(exclusions->begin(), exclusions->end(), [](const ExclusionScore& e) { return !e.expected(); }));
}

void scoreExclusions(CampaignReport& report, const std::vector<std::string>& excluded_hosts) {
  std::vector<ExclusionScore> out;
  for (const std::string& host : excluded_hosts) {
    ExclusionScore score{host, {}};
    for (const InjectionRecord& r : report.records)
      if (r.expected_host == host && r.injectionSucceeded()) score.injections.push_back(r.injection_id);
    out.push_back(std::move(score));
  }
  report.exclusions = std::move(out);
}

std::string CampaignReport::toJson(int indent) const {
  Json occ = Json::array(), recs = Json::array(), res = Json::array();
  for (const auto& o : occurrences) occ.push_back(o.toJson());
  for (const auto& r : records) recs.push_back(r.toJson());
  for (const auto& r : results) res.push_back(r.toJson());
  Json j{{"schema_version", 1},   {"kind", "lmr.campaign_report"},
         {"campaign", campaign},  {"manifest_identity", manifest_identity},
         {"occurrences", occ},    {"records", recs},
         {"results", res},        {"unmatched_results", unmatched_results},
         {"totals", totalsJson()}};
  if (exclusions) {
    Json ex = Json::array();
    for (const auto& e : *exclusions)
      ex.push_back(Json{{"host", e.host}, {"expected", e.expected()}, {"injections", e.injections}});
    j["exclusions"] = std::move(ex);
    j["totals"]["false_exclusions"] = falseExclusions();
  }
  return json::dumpWithRawMember(std::move(j), "manifest", manifest, indent);
}

CampaignReport evaluate(const Campaign& campaign, const std::vector<InjectionRecord>& records,
                        const std::vector<LocalizationResult>& results) {
  CampaignReport report;
  report.campaign = campaign.name();
  report.manifest_identity = campaign.identity();
  report.manifest = campaign.canonicalJson();
  report.records = records;
  report.results = results;

  std::map<std::string, std::vector<const InjectionRecord*>> by_occurrence;
  for (const InjectionRecord& r : records) by_occurrence[r.occurrence_id].push_back(&r);
  std::map<std::string, std::vector<const LocalizationResult*>> results_by_occurrence;
  for (const LocalizationResult& r : results) {
    results_by_occurrence[r.occurrence_id].push_back(&r);
    if (!by_occurrence.count(r.occurrence_id)) report.unmatched_results.push_back(r.occurrence_id);
  }
  report.unmatched_results = sortedUnique(report.unmatched_results);

  for (const auto& [occurrence_id, recs] : by_occurrence) {
    OccurrenceScore s;
    s.occurrence_id = occurrence_id;
    const OccurrenceKey key = parseOccurrenceId(occurrence_id);
    s.incident_id = key.incident_id;
    s.iteration = key.position;
    s.attempt = key.attempt;
    const Incident* inc = campaign.findIncident(key.incident_id);
    if (inc == nullptr)
      throw InvalidArgument("record " + recs.front()->injection_id + " names no incident of the manifest");

    s.skipped =
        std::all_of(recs.begin(), recs.end(), [](auto* r) { return r->status == RecordStatus::kSkippedProbability; });
    std::map<std::string, const InjectionRecord*> by_fault;
    for (const InjectionRecord* r : recs) by_fault[r->fault_id] = r;
    std::vector<Expectation> actions;
    bool all_injected = true;
    for (const Fault& f : inc->faults) {
      auto it = by_fault.find(f.fault_id);
      Expectation a{{f.target.expectedRank(), f.target.resource},
                    std::string(expectedKind(f.type, f.target.surface)),
                    f.target.component,
                    std::nullopt};
      // A host-bound action expects the rank its node had when it ran (its record says).
      if (f.target.host && it != by_fault.end()) a.target.first = it->second->expected_rank;
      if (f.target.component == "transformer_block") a.layer = f.target.index;
      actions.push_back(a);
      if (it == by_fault.end()) {
        s.reasons.push_back("no record of action " + f.fault_id);
        all_injected = false;
      } else if (!it->second->injectionSucceeded()) {
        s.reasons.push_back("action " + f.fault_id + " was not injected (" + std::string(name(it->second->status)) +
                            (it->second->verified ? "" : ", unverified") +
                            (it->second->error.empty() ? "" : ": " + it->second->error) + ")");
        all_injected = false;
      }
    }
    s.injection_succeeded = all_injected && !s.skipped;
    std::set<std::string> kinds;
    std::set<std::int64_t> ranks;
    std::set<std::string> resources, components;
    for (const Expectation& a : actions) {
      kinds.insert(a.kind);
      if (a.target.first) ranks.insert(*a.target.first);
      if (a.target.second) resources.insert(*a.target.second);
      if (a.component) components.insert(*a.component);
    }
    s.expected_kinds.assign(kinds.begin(), kinds.end());
    s.expected_ranks.assign(ranks.begin(), ranks.end());
    s.expected_resources.assign(resources.begin(), resources.end());
    s.expected_components.assign(components.begin(), components.end());

    const auto rit = results_by_occurrence.find(occurrence_id);
    const std::vector<const LocalizationResult*> mine =
        rit == results_by_occurrence.end() ? std::vector<const LocalizationResult*>{} : rit->second;
    s.results = mine.size();
    if (s.skipped) {
      if (!mine.empty()) s.reasons.push_back("results were submitted for an occurrence the probability skipped");
      report.occurrences.push_back(std::move(s));
      continue;
    }

    std::vector<const LocalizationResult*> attributing;
    for (const LocalizationResult* r : mine) {
      const bool counts = r->detected && (!r->kind || kinds.count(*r->kind));
      if (counts) {
        s.detected = true;
        if (r->latency_ms && (!s.latency_ms || *r->latency_ms < *s.latency_ms)) s.latency_ms = r->latency_ms;
      }
      if (r->detected && r->scope != "peer_group") attributing.push_back(r);
    }
    if (!s.detected)
      s.reasons.push_back(mine.empty() ? "no localization result" : "no result detected the injected kind");

    bool attributed = false;
    if (attributing.empty()) {
      if (s.detected) s.reasons.push_back("detected without rank-level attribution (peer_group scope only)");
    } else {
      attributed = matchTargets(actions, attributing, "", s.reasons);
      // Kind evidence: every reported kind must be injected, and each kind must localize
      // its own actions.
      std::set<std::string> reported_kinds;
      for (const LocalizationResult* r : attributing)
        if (r->kind) reported_kinds.insert(*r->kind);
      for (const std::string& k : reported_kinds) {
        if (!kinds.count(k)) {
          s.reasons.push_back("reported kind \"" + k + "\" was not injected");
          attributed = false;
          continue;
        }
        std::vector<Expectation> of_kind;
        for (const Expectation& a : actions)
          if (a.kind == k) of_kind.push_back(a);
        std::vector<const LocalizationResult*> said;
        for (const LocalizationResult* r : attributing)
          if (r->kind == k) said.push_back(r);
        attributed = matchTargets(of_kind, said, "kind \"" + k + "\": ", s.reasons) && attributed;
      }
      if (!reported_kinds.empty()) {
        for (const std::string& k : kinds) {
          if (!reported_kinds.count(k)) {
            s.reasons.push_back("expected kind \"" + k + "\" was not reported");
            attributed = false;
          }
        }
      }
      // Component evidence: exact set, associated with targets (and kinds when given).
      std::set<std::string> reported_components;
      bool any_components = false;
      for (const LocalizationResult* r : attributing) {
        if (r->components) {
          any_components = true;
          reported_components.insert(r->components->begin(), r->components->end());
        }
      }
      if (any_components) {
        if (components.empty()) {
          s.reasons.push_back("component evidence for targets that have no component");
          attributed = false;
        } else if (reported_components != components) {
          s.reasons.push_back("reported components differ from the injected ones");
          attributed = false;
        } else {
          using Label = std::pair<std::string, std::string>;  // (kind or "", component)
          attributed = matchAssociations<Label>(
                           actions, attributing,
                           [](const LocalizationResult& r) {
                             std::vector<Label> out;
                             if (r.components)
                               for (const auto& c : *r.components) out.emplace_back(r.kind.value_or(""), c);
                             return out;
                           },
                           [&](const Expectation& a) -> std::optional<Label> {
                             if (!a.component) return std::nullopt;
                             return Label{reported_kinds.empty() ? "" : a.kind, *a.component};
                           },
                           "component", s.reasons) &&
                       attributed;
        }
      }
      // Layer evidence: a specific layer must belong to the targets it names.
      const bool any_layer_target =
          std::any_of(actions.begin(), actions.end(), [](const Expectation& a) { return a.layer.has_value(); });
      for (const LocalizationResult* r : attributing) {
        if (r->layer_id && *r->layer_id >= 0 && !any_layer_target) {
          s.reasons.push_back("layer " + std::to_string(*r->layer_id) + " reported for targets that are not layers");
          attributed = false;
        }
      }
      if (any_layer_target) {
        attributed = matchAssociations<std::int64_t>(
                         actions, attributing,
                         [](const LocalizationResult& r) {
                           return (r.layer_id && *r.layer_id >= 0) ? std::vector<std::int64_t>{*r.layer_id}
                                                                   : std::vector<std::int64_t>{};
                         },
                         [](const Expectation& a) { return a.layer; }, "layer", s.reasons) &&
                     attributed;
      }
    }
    s.localized = s.injection_succeeded && s.detected && attributed;
    report.occurrences.push_back(std::move(s));
  }
  std::sort(report.occurrences.begin(), report.occurrences.end(),
            [&](const OccurrenceScore& a, const OccurrenceScore& b) {
              return std::tie(a.iteration, a.incident_id, a.attempt) < std::tie(b.iteration, b.incident_id, b.attempt);
            });
  return report;
}

}  // namespace lmr::campaign
