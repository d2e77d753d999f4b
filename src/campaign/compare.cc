#include "lmr/campaign/compare.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "lmr/common/error.h"

namespace lmr::campaign {
namespace {

using json::child;
using json::fail;
using json::item;

constexpr const char* kInjectionKind = "lmr.injection_records";
constexpr const char* kLocalizationKind = "lmr.localization_results";

void checkHeader(const Json& j, const char* kind) {
  if (json::asInteger(json::requireMember(j, "", "schema_version"), "schema_version") != 1) {
    fail("schema_version", "unsupported version");
  }
  if (json::asString(json::requireMember(j, "", "kind"), "kind") != kind) {
    fail("kind", std::string("must be \"") + kind + "\"");
  }
}

// The record the manifest implies for `r`'s candidate, to compare field by field.
void checkAgainstManifest(const InjectionArtifact& a, const InjectionRecord& r, const std::string& where) {
  const Campaign& c = *a.campaign;
  const Incident* inc = c.findIncident(r.incident_id);
  if (inc == nullptr) throw InvalidArgument(where + ": incident \"" + r.incident_id + "\" is not in the manifest");
  std::size_t fault = inc->faults.size();
  for (std::size_t f = 0; f < inc->faults.size(); ++f)
    if (inc->faults[f].fault_id == r.fault_id) fault = f;
  if (fault == inc->faults.size())
    throw InvalidArgument(where + ": fault \"" + r.fault_id + "\" is not in incident \"" + r.incident_id + "\"");
  if (!inc->trigger.isCandidate(r.iteration)) {
    throw InvalidArgument(where + ": iteration " + std::to_string(r.iteration) + " is not a trigger candidate");
  }
  const std::size_t incident = static_cast<std::size_t>(inc - c.incidents().data());
  const bool selected = isSelected(c, *inc, r.iteration);
  const Candidate cand{incident, r.iteration, r.iteration + a.clock_offset, selected};
  const InjectionRecord expected = makeRecord(c, incident, fault, cand, r.attempt);
  const Json got = r.toJson();
  Json want = expected.toJson();
  if (inc->faults[fault].target.host) {  // placed where its node was: the rank it ran on is the one expected
    want["execution_rank"] = r.execution_rank;
    want["expected_rank"] = r.execution_rank;
  }
  for (const char* key :
       {"injection_id", "occurrence_id", "training_iteration", "type", "temporal_class", "safety_class", "target",
        "parameters", "execution_rank", "expected_rank", "expected_resource", "expected_host", "expected_component",
        "expected_layer", "expected_kind"}) {
    if (got[key] != want[key]) {
      throw InvalidArgument(where + "." + key + ": " + got[key].dump() + " contradicts the manifest (" +
                            want[key].dump() + ")");
    }
  }
  if (r.execution_rank != a.rank) {
    throw InvalidArgument(where + ".execution_rank: " + std::to_string(r.execution_rank) + " in the artifact of rank " +
                          std::to_string(a.rank));
  }
  const bool skipped = r.status == RecordStatus::kSkippedProbability;
  if (skipped == selected) {
    throw InvalidArgument(where + ".status: " + std::string(name(r.status)) + " but the manifest's seed " +
                          (selected ? "selects" : "does not select") + " this candidate");
  }
  if (skipped && r.attempt != 1) throw InvalidArgument(where + ".attempt: a probability skip is attempt 1");
  const bool too_many = (inc->retrigger == Retrigger::kOnce && r.attempt > 1) ||
                        (inc->retrigger == Retrigger::kMaxOccurrences && r.attempt > inc->max_occurrences);
  if (too_many)
    throw InvalidArgument(where + ".attempt: " + std::to_string(r.attempt) + " exceeds the retrigger policy");
}

}  // namespace

InjectionArtifact InjectionArtifact::parse(std::string_view text, std::string_view source) {
  const json::Document doc = json::parse(text, source);
  try {
    const Json& j = doc.value;
    json::requireKnownKeys(j, "",
                           {"schema_version", "kind", "rank", "completed_iterations", "clock_offset",
                            "manifest_identity", "manifest", "records"});
    checkHeader(j, kInjectionKind);
    InjectionArtifact a;
    a.source = std::string(source);
    a.rank = json::asNonNegativeInteger(json::requireMember(j, "", "rank"), "rank");
    a.completed_iterations =
        json::asNonNegativeInteger(json::requireMember(j, "", "completed_iterations"), "completed_iterations");
    a.clock_offset = json::asNonNegativeInteger(json::requireMember(j, "", "clock_offset"), "clock_offset");
    const std::string identity =
        json::asIdentifier(json::requireMember(j, "", "manifest_identity"), "manifest_identity");
    // Re-parse the embedded manifest from its own text, keeping its 128-bit seed exact.
    json::Document manifest;
    manifest.value = json::requireMember(j, "", "manifest");
    for (const auto& [path, raw] : doc.big_integers) {
      if (path.rfind("manifest.", 0) == 0) manifest.big_integers[path.substr(9)] = raw;
    }
    try {
      a.campaign = std::make_shared<const Campaign>(Campaign::fromDocument(manifest));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("manifest." + e.message());
    }
    if (a.campaign->identity() != identity) {
      fail("manifest_identity", "the embedded manifest hashes to " + a.campaign->identity() + ", not " + identity);
    }
    const Json& records = json::requireMember(j, "", "records");
    if (!records.is_array()) fail("records", "must be an array");
    for (std::size_t i = 0; i < records.size(); ++i)
      a.records.push_back(InjectionRecord::fromJson(records[i], item("records", i)));
    return a;
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(source) + ": " + e.message());
  }
}

std::string InjectionArtifact::toJson(int indent) const {
  Json recs = Json::array();
  for (const InjectionRecord& r : records) recs.push_back(r.toJson());
  Json j{{"schema_version", 1},
         {"kind", kInjectionKind},
         {"rank", rank},
         {"completed_iterations", completed_iterations},
         {"clock_offset", clock_offset},
         {"manifest_identity", campaign->identity()},
         {"records", recs}};
  return json::dumpWithRawMember(std::move(j), "manifest", campaign->canonicalJson(), indent);
}

std::vector<LocalizationResult> parseLocalizationArtifact(std::string_view text, std::string_view source) {
  const json::Document doc = json::parse(text, source);
  try {
    const Json& j = doc.value;
    json::requireKnownKeys(j, "", {"schema_version", "kind", "results"});
    checkHeader(j, kLocalizationKind);
    const Json& results = json::requireMember(j, "", "results");
    if (!results.is_array()) fail("results", "must be an array");
    std::vector<LocalizationResult> out;
    for (std::size_t i = 0; i < results.size(); ++i)
      out.push_back(LocalizationResult::fromJson(results[i], item("results", i)));
    return out;
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(source) + ": " + e.message());
  }
}

std::string localizationArtifactJson(const std::vector<LocalizationResult>& results, int indent) {
  Json arr = Json::array();
  for (const auto& r : results) arr.push_back(r.toJson());
  return Json{{"schema_version", 1}, {"kind", kLocalizationKind}, {"results", arr}}.dump(indent);
}

CampaignReport compareArtifacts(const std::vector<InjectionArtifact>& artifacts,
                                const std::vector<LocalizationResult>& results) {
  if (artifacts.empty()) throw InvalidArgument("compare needs at least one injection artifact");
  const InjectionArtifact& first = artifacts.front();
  const Campaign& campaign = *first.campaign;
  std::int64_t completed = 0;
  std::vector<InjectionRecord> all;
  std::set<std::string> seen;
  for (const InjectionArtifact& a : artifacts) {
    if (a.campaign->identity() != campaign.identity()) {
      throw InvalidArgument(a.source + ": manifest " + a.campaign->identity() + " differs from " + first.source +
                            "'s " + campaign.identity());
    }
    if (a.clock_offset != first.clock_offset) {
      throw InvalidArgument(a.source + ": clock_offset " + std::to_string(a.clock_offset) + " differs from " +
                            first.source + "'s " + std::to_string(first.clock_offset));
    }
    completed = std::max(completed, a.completed_iterations);
    for (std::size_t i = 0; i < a.records.size(); ++i) {
      const InjectionRecord& r = a.records[i];
      const std::string where = a.source + ": " + item("records", i);
      checkAgainstManifest(a, r, where);
      if (!seen.insert(r.injection_id).second)
        throw InvalidArgument(where + ": action " + r.injection_id + " is recorded twice");
      all.push_back(r);
    }
  }
  CampaignReport report = evaluate(campaign, all, results);
  // Every candidate up to the completed iteration must be accounted for, skips included.
  std::set<std::string> present;
  for (const InjectionRecord& r : all) present.insert(r.injection_id);
  forEachCandidate(campaign, first.clock_offset, 0, completed, [&](const Candidate& cand) {
    const Incident& inc = campaign.incidents()[cand.incident];
    const std::string occurrence = occurrenceId(inc.incident_id, cand.position);
    std::vector<std::string> missing;
    for (const Fault& f : inc.faults)
      if (!present.count(injectionId(occurrence, f.fault_id))) missing.push_back(f.fault_id);
    if (missing.empty()) return;
    const bool none = missing.size() == inc.faults.size();
    if (!none) return;  // partially recorded occurrences are scored by evaluate() already
    OccurrenceScore s;
    s.occurrence_id = occurrence;
    s.incident_id = inc.incident_id;
    s.iteration = cand.position;
    s.reasons.push_back("no injection record for this candidate (lost occurrence)");
    report.occurrences.push_back(std::move(s));
  });
  std::sort(report.occurrences.begin(), report.occurrences.end(),
            [](const OccurrenceScore& a, const OccurrenceScore& b) {
              return std::tie(a.iteration, a.incident_id, a.attempt) < std::tie(b.iteration, b.incident_id, b.attempt);
            });
  return report;
}

// Built without iostreams: a number formatted through std::ostream inside _core crashed in
// a process that had loaded torch first (seen on the accelerator machine).
std::string formatReportTable(const CampaignReport& report) {
  std::string out = "campaign " + report.campaign + "  " + report.manifest_identity + "\n";
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  char line[512];
  std::snprintf(line, sizeof line, "%-36s %10s %-9s %-9s %-10s %s\n", "occurrence", "iteration", "injected", "detected",
                "localized", "expected / reason");
  out += line;
  for (const OccurrenceScore& o : report.occurrences) {
    std::string expected;
    if (o.skipped) {
      expected = "skipped by probability";
    } else {
      expected = "ranks [";
      for (std::size_t i = 0; i < o.expected_ranks.size(); ++i) {
        if (i) expected += ",";
        expected += std::to_string(o.expected_ranks[i]);
      }
      expected += "]";
      if (!o.expected_resources.empty()) {
        expected += " resources [";
        for (std::size_t i = 0; i < o.expected_resources.size(); ++i)
          expected += (i ? "," : "") + o.expected_resources[i];
        expected += "]";
      }
      if (!o.reasons.empty()) expected += "  -- " + o.reasons.front();
    }
    std::snprintf(line, sizeof line, "%-36s %10lld %-9s %-9s %-10s %s\n", o.occurrence_id.c_str(),
                  static_cast<long long>(o.iteration), o.skipped ? "-" : yes(o.injection_succeeded),
                  o.skipped ? "-" : yes(o.detected), o.skipped ? "-" : yes(o.localized), expected.c_str());
    out += line;
  }
  out += "totals: " + std::to_string(report.scored()) + " occurrences (" +
         std::to_string(report.occurrences.size() - report.scored()) + " skipped by probability), " +
         std::to_string(report.injected()) + " injected, " + std::to_string(report.detected()) + " detected, " +
         std::to_string(report.localized()) + " localized";
  if (auto mean = report.meanLatencyMs()) {
    std::snprintf(line, sizeof line, ", mean latency %g ms", *mean);
    out += line;
  }
  if (!report.unmatched_results.empty())
    out += ", " + std::to_string(report.unmatched_results.size()) + " results matched no occurrence";
  if (report.exclusions) {
    out += "\nexclusions: " + std::to_string(report.exclusions->size()) + " node(s), " +
           std::to_string(report.falseExclusions()) + " false";
    for (const ExclusionScore& e : *report.exclusions) {
      out += "\n  " + e.host + ": ";
      if (!e.expected()) {
        out += "FALSE EXCLUSION (no injected fault lived there)";
        continue;
      }
      out += "expected (";
      for (std::size_t i = 0; i < e.injections.size(); ++i) out += (i ? ", " : "") + e.injections[i];
      out += ")";
    }
  }
  out += "\n";
  return out;
}

}  // namespace lmr::campaign
