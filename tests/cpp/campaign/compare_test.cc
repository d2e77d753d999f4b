#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lmr/campaign/compare.h"
#include "test_util.h"

namespace lmr::campaign {
namespace {

using json::Json;

// Artifacts of a finished run of the spec's example on 8 ranks: every selected candidate
// injected and verified by the rank that executes it, skips recorded too.
std::vector<InjectionArtifact> runArtifacts(const std::shared_ptr<const Campaign>& c, std::int64_t completed) {
  std::vector<InjectionArtifact> out(8);
  for (std::int64_t rank = 0; rank < 8; ++rank) {
    out[rank].source = "rank-" + std::to_string(rank) + ".json";
    out[rank].rank = rank;
    out[rank].completed_iterations = completed;
    out[rank].campaign = c;
  }
  forEachCandidate(*c, 0, 0, completed, [&](const Candidate& cand) {
    const Incident& inc = c->incidents()[cand.incident];
    for (std::size_t f = 0; f < inc.faults.size(); ++f) {
      InjectionRecord r = makeRecord(*c, cand.incident, f, cand, 1);
      if (cand.selected) {
        r.transition(RecordStatus::kActive);
        r.verified = true;
        r.actual_iteration = cand.iteration;
        r.executor = "builtin";
        r.transition(RecordStatus::kCompleted);
      }
      out[r.execution_rank].records.push_back(r);
    }
  });
  return out;
}

std::vector<LocalizationResult> perfectResults(const std::vector<InjectionArtifact>& artifacts) {
  std::vector<LocalizationResult> out;
  for (const auto& a : artifacts)
    for (const auto& r : a.records) {
      if (r.status == RecordStatus::kSkippedProbability) continue;
      LocalizationResult l;
      l.occurrence_id = r.occurrence_id;
      l.detected = true;
      l.failed_ranks = {*r.expected_rank};
      l.kind = r.expected_kind;
      out.push_back(l);
    }
  return out;
}

class Compare : public ::testing::Test {
 protected:
  Compare()
      : campaign(
            std::make_shared<const Campaign>(Campaign::parse(testing::readExample("mixed-production-failures.json")))) {
  }

  // Round-trips every artifact through its JSON text first, as the CLI does.
  CampaignReport run(const std::vector<InjectionArtifact>& artifacts, const std::vector<LocalizationResult>& results) {
    std::vector<InjectionArtifact> parsed;
    for (const auto& a : artifacts) parsed.push_back(InjectionArtifact::parse(a.toJson(), a.source));
    return compareArtifacts(parsed, parseLocalizationArtifact(localizationArtifactJson(results), "loc.json"));
  }

  std::string integrityError(const std::vector<InjectionArtifact>& artifacts) {
    try {
      run(artifacts, {});
      return "";
    } catch (const InvalidArgument& e) {
      return e.message();
    }
  }

  std::shared_ptr<const Campaign> campaign;
};

TEST_F(Compare, PerfectLocalizationCertifies) {
  auto artifacts = runArtifacts(campaign, 1000);
  const CampaignReport report = run(artifacts, perfectResults(artifacts));
  EXPECT_TRUE(report.allLocalized());
  EXPECT_EQ(report.scored(), 4u);  // 37, 203, 911 and the one selected straggler candidate
  EXPECT_EQ(report.occurrences.size(), 14u);
  const std::string table = formatReportTable(report);
  EXPECT_NE(table.find("sporadic-sdc@911"), std::string::npos);
  EXPECT_NE(table.find("totals: 4 occurrences (10 skipped by probability), 4 injected, 4 detected, 4 localized"),
            std::string::npos)
      << table;
}

TEST_F(Compare, LostAndPartialOccurrencesStayInTheDenominator) {
  auto artifacts = runArtifacts(campaign, 1000);
  auto results = perfectResults(artifacts);
  auto& rank3 = artifacts[3].records;
  rank3.erase(std::remove_if(rank3.begin(), rank3.end(), [](auto& r) { return r.occurrence_id == "sporadic-sdc@203"; }),
              rank3.end());
  const CampaignReport report = run(artifacts, results);
  EXPECT_FALSE(report.allLocalized());
  EXPECT_EQ(report.scored(), 4u);
  EXPECT_EQ(report.localized(), 3u);
  EXPECT_EQ(report.unmatched_results, (std::vector<std::string>{"sporadic-sdc@203"}));
  // A rank that stopped early loses its later records: still counted.
  auto early = runArtifacts(campaign, 1000);
  early[3].completed_iterations = 500;
  auto& r3 = early[3].records;
  r3.erase(std::remove_if(r3.begin(), r3.end(), [](auto& r) { return r.iteration > 500; }), r3.end());
  const CampaignReport partial = run(early, perfectResults(runArtifacts(campaign, 1000)));
  EXPECT_EQ(partial.scored(), 4u);
  EXPECT_EQ(partial.localized(), 3u);
}

TEST_F(Compare, TamperingIsRejected) {
  auto artifacts = runArtifacts(campaign, 1000);
  {
    auto t = artifacts;
    t[3].records[0].target["rank"] = 4;
    EXPECT_NE(integrityError(t).find("rank-3.json: records[0].target"), std::string::npos) << integrityError(t);
  }
  {
    auto t = artifacts;
    t[3].records[0].parameters["operation"] = "scale";
    EXPECT_NE(integrityError(t).find("records[0].parameters: "), std::string::npos);
  }
  {
    auto t = artifacts;
    t[5].records.push_back(t[5].records[0]);  // an action twice
    EXPECT_NE(integrityError(t).find("is recorded twice"), std::string::npos);
  }
  {
    auto t = artifacts;
    for (auto& r : t[5].records)
      if (r.status == RecordStatus::kSkippedProbability) {
        r.status = RecordStatus::kArmed;  // claims a candidate the seed skips was selected
        break;
      }
    EXPECT_NE(integrityError(t).find("does not select this candidate"), std::string::npos);
  }
  {
    auto t = artifacts;
    t[0].records = t[3].records;  // records filed under the wrong rank
    t[3].records.clear();
    EXPECT_NE(integrityError(t).find("execution_rank"), std::string::npos);
  }
  {
    auto t = artifacts;
    t[3].records[0].attempt = 2;  // retrigger once allows one attempt
    t[3].records[0].occurrence_id = "sporadic-sdc@37#2";
    t[3].records[0].injection_id = "sporadic-sdc@37#2/hidden-output";
    EXPECT_NE(integrityError(t).find("exceeds the retrigger policy"), std::string::npos);
  }
  {
    // An edited embedded manifest no longer hashes to its stated identity.
    std::string text = artifacts[0].toJson();
    const std::size_t at = text.find("\"dp=8,tp=2\"");
    text.replace(at, 11, "\"dp=4,tp=4\"");
    EXPECT_THROW(InjectionArtifact::parse(text, "rank-0.json"), InvalidArgument);
  }
  {
    // A strict boolean.
    Json j = Json::parse(artifacts[3].toJson());
    j["records"][0]["verified"] = "true";
    EXPECT_THROW(InjectionArtifact::parse(j.dump(), "rank-3.json"), InvalidArgument);
  }
}

TEST_F(Compare, ArtifactsMustShareManifestAndClock) {
  auto artifacts = runArtifacts(campaign, 1000);
  Json other = Json::parse(testing::readExample("mixed-production-failures.json"));
  other["seed"] = 18;
  artifacts[2].campaign = std::make_shared<const Campaign>(Campaign::parse(other.dump()));
  artifacts[2].records.clear();
  EXPECT_NE(integrityError(artifacts).find("rank-2.json: manifest"), std::string::npos);
  auto shifted = runArtifacts(campaign, 1000);
  shifted[1].clock_offset = 5;
  EXPECT_NE(integrityError(shifted).find("clock_offset"), std::string::npos);
}

}  // namespace
}  // namespace lmr::campaign
