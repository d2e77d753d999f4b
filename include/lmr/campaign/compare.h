// Certification of a campaign from its artifacts: the rank-local injection artifacts the
// fault-injection session writes, and a localization artifact from the system under test.
//
// Injection artifact (one per rank, JSON):
//   {"schema_version": 1, "kind": "lmr.injection_records", "rank": R,
//    "completed_iterations": N, "clock_offset": K, "manifest_identity": "sha256:...",
//    "manifest": {...canonical manifest...}, "records": [InjectionRecord...]}
// Localization artifact:
//   {"schema_version": 1, "kind": "lmr.localization_results", "results": [LocalizationResult...]}
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/campaign/evaluate.h"

namespace lmr::campaign {

struct InjectionArtifact {
  std::string source;  // file name, for messages
  std::int64_t rank = 0;
  std::int64_t completed_iterations = 0;  // absolute training iterations done
  std::int64_t clock_offset = 0;          // absolute iteration of manifest position 0
  std::shared_ptr<const Campaign> campaign;
  std::vector<InjectionRecord> records;

  // Strict; the embedded manifest must hash to the stated identity.
  static InjectionArtifact parse(std::string_view text, std::string_view source);
  std::string toJson(int indent = 2) const;
};

std::vector<LocalizationResult> parseLocalizationArtifact(std::string_view text, std::string_view source);
std::string localizationArtifactJson(const std::vector<LocalizationResult>& results, int indent = 2);

// Aggregates the artifacts and scores them. Throws InvalidArgument (naming the artifact and
// record) when they disagree on the manifest or clock, repeat an action, or contradict the
// manifest (tampered type, target, parameters, expectations, statuses, probability skips).
// Candidates at or before the largest completed iteration that lack records are scored as
// occurrences that were not injected, so a lost occurrence cannot shrink the denominator.
CampaignReport compareArtifacts(const std::vector<InjectionArtifact>& artifacts,
                                const std::vector<LocalizationResult>& results);

// A per-occurrence table with totals, for people.
std::string formatReportTable(const CampaignReport& report);

}  // namespace lmr::campaign
