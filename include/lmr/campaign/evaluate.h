// Scoring any localization system against campaign ground truth.
//
// An occurrence is localized only when every fault action of it was injected (verified),
// some result detected it, and the results that attribute it (scope other than
// "peer_group") name exactly the expected ranks and resources, keep each action's
// (rank, resource) pairing, and, when they report a kind, components or a layer, report
// them for exactly the right targets. docs/campaigns.md spells out every rule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lmr/campaign/manifest.h"
#include "lmr/campaign/record.h"

namespace lmr::campaign {

// What a resiliency system reports about one occurrence. Several results may share an
// occurrence_id (one per failure kind or per target).
struct LocalizationResult {
  std::string occurrence_id;
  bool detected = false;
  std::vector<std::int64_t> failed_ranks;           // sorted, unique
  std::vector<std::string> failed_resources;        // sorted, unique
  std::optional<std::string> kind;                  // "sdc", "straggler", "hang", ...
  std::optional<std::vector<std::string>> components;  // sorted, unique
  std::optional<std::int64_t> layer_id;             // -1: aggregate over layers
  std::optional<double> latency_ms;
  std::string scope = "rank";                       // "peer_group": detection only

  // Strict: unknown keys, scalars where arrays belong, non-booleans for `detected` are
  // rejected with the JSON path.
  static LocalizationResult fromJson(const Json& value, const std::string& path);
  Json toJson() const;
};

struct OccurrenceScore {
  std::string occurrence_id;
  std::string incident_id;
  std::int64_t iteration = 0;
  std::int64_t attempt = 1;
  bool skipped = false;  // unselected by probability: not part of the score
  bool injection_succeeded = false;
  bool detected = false;
  bool localized = false;
  std::vector<std::int64_t> expected_ranks;
  std::vector<std::string> expected_resources;
  std::vector<std::string> expected_kinds;
  std::vector<std::string> expected_components;
  std::optional<double> latency_ms;  // smallest reported latency among detecting results
  std::size_t results = 0;           // results submitted for it
  std::vector<std::string> reasons;  // why it is not localized

  Json toJson() const;
};

// One node a recovery excluded (lmr-exclusions.json), scored against the records: expected when
// an injected host-bound action lived on it, else a false exclusion.
struct ExclusionScore {
  std::string host;
  std::vector<std::string> injections;  // the injected host-bound actions that lived there
  bool expected() const { return !injections.empty(); }
};

struct CampaignReport {
  std::string campaign;
  std::string manifest_identity;
  std::string manifest;  // canonical JSON text of the manifest
  std::vector<InjectionRecord> records;
  std::vector<LocalizationResult> results;
  std::vector<OccurrenceScore> occurrences;  // in (iteration, incident, attempt) order
  std::vector<std::string> unmatched_results;  // occurrence ids no record has
  std::optional<std::vector<ExclusionScore>> exclusions;  // when the job's exclusions were scored

  std::size_t scored() const;     // occurrences not skipped
  std::size_t injected() const;
  std::size_t detected() const;
  std::size_t localized() const;
  std::optional<double> meanLatencyMs() const;  // over localized occurrences with a latency
  bool allLocalized() const { return localized() == scored(); }
  std::size_t falseExclusions() const;
  // Every occurrence localized and no node excluded that no fault lived on.
  bool passed() const { return allLocalized() && falseExclusions() == 0; }

  Json totalsJson() const;
  std::string toJson(int indent = 2) const;  // the complete report, manifest embedded
};

// Scores `results` against `records` (the rank-local records of all ranks, aggregated).
// An occurrence whose incident has actions without a record is not injected.
CampaignReport evaluate(const Campaign& campaign, const std::vector<InjectionRecord>& records,
                        const std::vector<LocalizationResult>& results);

// Scores the nodes the job excluded (`excluded_hosts`, e.g. the ledger's) against the report's
// records: each is expected when an injected action with that expected_host lived there.
void scoreExclusions(CampaignReport& report, const std::vector<std::string>& excluded_hosts);

}  // namespace lmr::campaign
