#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lmr/campaign/compare.h"
#include "lmr/campaign/evaluate.h"
#include "test_util.h"

namespace lmr::campaign {
namespace {

using json::Json;

// One campaign with an incident per situation the scoring rules distinguish.
const char* kEvaluatedManifest = R"({
  "name": "scoring",
  "incidents": [
    {"incident_id": "sdc", "trigger": {"at": [10]}, "lifetime": {"matching_calls": 1},
     "faults": [{"fault_id": "f", "type": "tensor_corruption",
                 "target": {"rank": 3, "component": "transformer_block", "index": 12, "surface": "output"},
                 "parameters": {"operation": "sign_flip"}}]},
    {"incident_id": "pairs", "trigger": {"at": [20]}, "lifetime": {"iterations": 1},
     "faults": [{"fault_id": "a", "type": "delay", "target": {"rank": 1, "resource": "gpu-a", "surface": "collective"}, "parameters": {"delay_ms": 5}},
                {"fault_id": "b", "type": "delay", "target": {"rank": 2, "resource": "gpu-b", "surface": "collective"}, "parameters": {"delay_ms": 5}}]},
    {"incident_id": "nic", "trigger": {"at": [30]}, "lifetime": {"iterations": 1},
     "faults": [{"fault_id": "down", "type": "network_partition", "target": {"resource": "nic-3", "surface": "resource"}}]},
    {"incident_id": "mixed", "trigger": {"at": [40]}, "lifetime": {"iterations": 1},
     "faults": [{"fault_id": "corrupt", "type": "tensor_corruption", "target": {"rank": 1, "component": "embedding", "surface": "gradient"},
                 "parameters": {"operation": "scale", "factor": 4}},
                {"fault_id": "slow", "type": "delay", "target": {"rank": 2, "component": "transformer_block", "index": 0, "surface": "compute"},
                 "parameters": {"delay_ms": 100}}]},
    {"incident_id": "maybe", "trigger": {"at": [50], "probability": 0.0}, "lifetime": {"matching_calls": 1},
     "faults": [{"fault_id": "f", "type": "tensor_corruption", "target": {"rank": 0, "component": "output", "surface": "output"},
                 "parameters": {"operation": "sign_flip"}}]}
  ]
})";

class Scoring : public ::testing::Test {
 protected:
  Scoring() : campaign(Campaign::parse(kEvaluatedManifest)) {}

  // Records of every action of every incident, injected and verified.
  std::vector<InjectionRecord> records(bool inject = true) const {
    std::vector<InjectionRecord> out;
    for (std::size_t i = 0; i < campaign.incidents().size(); ++i) {
      const Incident& inc = campaign.incidents()[i];
      const std::int64_t pos = inc.trigger.firstCandidate();
      const Candidate cand{i, pos, pos, isSelected(campaign, inc, pos)};
      for (std::size_t f = 0; f < inc.faults.size(); ++f) {
        InjectionRecord r = makeRecord(campaign, i, f, cand, 1);
        if (inject && cand.selected) {
          r.transition(RecordStatus::kActive);
          r.verified = true;
          r.actual_iteration = pos;
          r.executor = "test";
          r.transition(RecordStatus::kCompleted);
        }
        out.push_back(r);
      }
    }
    return out;
  }

  static LocalizationResult result(std::string id, std::vector<std::int64_t> ranks,
                                   std::vector<std::string> resources = {}) {
    LocalizationResult r;
    r.occurrence_id = std::move(id);
    r.detected = true;
    r.failed_ranks = std::move(ranks);
    r.failed_resources = std::move(resources);
    return r;
  }

  const OccurrenceScore& score(const CampaignReport& report, const std::string& id) const {
    for (const auto& o : report.occurrences)
      if (o.occurrence_id == id) return o;
    throw std::runtime_error("no occurrence " + id);
  }

  bool localized(const std::vector<LocalizationResult>& results, const std::string& id) const {
    return score(evaluate(campaign, records(), results), id).localized;
  }

  Campaign campaign;
};

TEST_F(Scoring, ExactRankWithKindComponentLayerAndLatency) {
  LocalizationResult r = result("sdc@10", {3});
  r.kind = "sdc";
  r.components = std::vector<std::string>{"transformer_block"};
  r.layer_id = 12;
  r.latency_ms = 8.4;
  const CampaignReport report = evaluate(campaign, records(), {r});
  const OccurrenceScore& s = score(report, "sdc@10");
  EXPECT_TRUE(s.localized) << ::testing::PrintToString(s.reasons);
  EXPECT_EQ(s.latency_ms, 8.4);
  EXPECT_EQ(s.expected_ranks, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(s.expected_kinds, (std::vector<std::string>{"sdc"}));
  EXPECT_EQ(report.meanLatencyMs(), 8.4);
}

TEST_F(Scoring, RankSetsMustBeExact) {
  EXPECT_FALSE(localized({result("sdc@10", {3, 4})}, "sdc@10"));  // an extra rank
  EXPECT_FALSE(localized({result("sdc@10", {})}, "sdc@10"));
  EXPECT_FALSE(localized({result("sdc@10", {2})}, "sdc@10"));
  auto undetected = result("sdc@10", {3});
  undetected.detected = false;
  EXPECT_FALSE(localized({undetected}, "sdc@10"));
}

TEST_F(Scoring, OptionalEvidenceMustMatch) {
  auto wrong_kind = result("sdc@10", {3});
  wrong_kind.kind = "straggler";
  const auto s = score(evaluate(campaign, records(), {wrong_kind}), "sdc@10");
  EXPECT_FALSE(s.detected);  // an unrelated report does not count as detection
  EXPECT_FALSE(s.localized);
  auto wrong_component = result("sdc@10", {3});
  wrong_component.components = std::vector<std::string>{"embedding"};
  EXPECT_FALSE(localized({wrong_component}, "sdc@10"));
  auto extra_component = result("sdc@10", {3});
  extra_component.components = std::vector<std::string>{"embedding", "transformer_block"};
  EXPECT_FALSE(localized({extra_component}, "sdc@10"));
  auto wrong_layer = result("sdc@10", {3});
  wrong_layer.layer_id = 5;
  EXPECT_FALSE(localized({wrong_layer}, "sdc@10"));
  auto aggregate_layer = result("sdc@10", {3});
  aggregate_layer.layer_id = -1;
  EXPECT_TRUE(localized({aggregate_layer}, "sdc@10"));
}

TEST_F(Scoring, PeerGroupScopeDetectsButDoesNotAttribute) {
  auto peer = result("sdc@10", {3});
  peer.scope = "peer_group";
  const auto s = score(evaluate(campaign, records(), {peer}), "sdc@10");
  EXPECT_TRUE(s.detected);
  EXPECT_FALSE(s.localized);
}

TEST_F(Scoring, RankResourcePairsKeepTheirAssociation) {
  EXPECT_TRUE(localized({result("pairs@20", {1}, {"gpu-a"}), result("pairs@20", {2}, {"gpu-b"})}, "pairs@20"));
  // Correct projections, swapped pairs.
  EXPECT_FALSE(localized({result("pairs@20", {1}, {"gpu-b"}), result("pairs@20", {2}, {"gpu-a"})}, "pairs@20"));
  // One result naming both ranks and both resources crosses them.
  EXPECT_FALSE(localized({result("pairs@20", {1, 2}, {"gpu-a", "gpu-b"})}, "pairs@20"));
  // Rank only, or resource only, is incomplete.
  EXPECT_FALSE(localized({result("pairs@20", {1, 2})}, "pairs@20"));
  EXPECT_FALSE(localized({result("pairs@20", {}, {"gpu-a", "gpu-b"})}, "pairs@20"));
}

TEST_F(Scoring, ResourceOnlyTargetsExpectNoRank) {
  EXPECT_TRUE(localized({result("nic@30", {}, {"nic-3"})}, "nic@30"));
  EXPECT_FALSE(localized({result("nic@30", {0}, {"nic-3"})}, "nic@30"));  // the executing rank is not the culprit
  auto overclaim = result("nic@30", {}, {"nic-3"});
  overclaim.components = std::vector<std::string>{"embedding"};
  EXPECT_FALSE(localized({overclaim}, "nic@30"));
  auto layer = result("nic@30", {}, {"nic-3"});
  layer.layer_id = 0;
  EXPECT_FALSE(localized({layer}, "nic@30"));
}

TEST_F(Scoring, EachKindLocalizesItsOwnActions) {
  auto sdc = result("mixed@40", {1});
  sdc.kind = "sdc";
  auto slow = result("mixed@40", {2});
  slow.kind = "straggler";
  EXPECT_TRUE(localized({sdc, slow}, "mixed@40"));
  // Aggregate sets right, kinds swapped.
  auto sdc_swapped = result("mixed@40", {2});
  sdc_swapped.kind = "sdc";
  auto slow_swapped = result("mixed@40", {1});
  slow_swapped.kind = "straggler";
  EXPECT_FALSE(localized({sdc_swapped, slow_swapped}, "mixed@40"));
  // One kind missing.
  EXPECT_FALSE(localized({sdc, result("mixed@40", {2})}, "mixed@40"));
  // Without kind evidence the aggregate sets decide.
  EXPECT_TRUE(localized({result("mixed@40", {1, 2})}, "mixed@40"));
  // Components swapped between the two targets.
  auto c1 = result("mixed@40", {1});
  c1.components = std::vector<std::string>{"transformer_block"};
  auto c2 = result("mixed@40", {2});
  c2.components = std::vector<std::string>{"embedding"};
  EXPECT_FALSE(localized({c1, c2}, "mixed@40"));
  c1.components = std::vector<std::string>{"embedding"};
  c2.components = std::vector<std::string>{"transformer_block"};
  EXPECT_TRUE(localized({c1, c2}, "mixed@40"));
  // A layer on the embedding's rank is contradictory.
  c2.layer_id = 0;
  EXPECT_TRUE(localized({c1, c2}, "mixed@40"));
  c1.layer_id = 0;
  EXPECT_FALSE(localized({c1, c2}, "mixed@40"));
}

TEST_F(Scoring, FailedOrMissingInjectionsCannotBeLocalized) {
  auto recs = records();
  for (auto& r : recs)
    if (r.occurrence_id == "sdc@10") r.verified = false;
  EXPECT_FALSE(score(evaluate(campaign, recs, {result("sdc@10", {3})}), "sdc@10").localized);
  auto partial = records();
  partial.erase(std::remove_if(partial.begin(), partial.end(), [](auto& r) { return r.injection_id == "pairs@20/b"; }),
                partial.end());
  const auto s =
      score(evaluate(campaign, partial, {result("pairs@20", {1}, {"gpu-a"}), result("pairs@20", {2}, {"gpu-b"})}),
            "pairs@20");
  EXPECT_FALSE(s.injection_succeeded);
  EXPECT_FALSE(s.localized);
  EXPECT_EQ(s.reasons.front(), "no record of action b");
}

TEST_F(Scoring, SkipsAndUnmatchedResults) {
  const CampaignReport report = evaluate(campaign, records(), {result("ghost@1", {0})});
  EXPECT_TRUE(score(report, "maybe@50").skipped);
  EXPECT_EQ(report.scored(), 4u);
  EXPECT_EQ(report.unmatched_results, (std::vector<std::string>{"ghost@1"}));
  const Json j = Json::parse(report.toJson());
  EXPECT_EQ(j["totals"]["occurrences"], 4);
  EXPECT_EQ(j["totals"]["skipped"], 1);
  EXPECT_EQ(j["manifest_identity"], campaign.identity());
  EXPECT_EQ(Campaign::parse(j["manifest"].dump()).identity(), campaign.identity());
}

// A host-bound fault expects the rank it ran on (its record says), and the node a recovery
// excluded is scored against where injected faults lived.
TEST(ExclusionScoring, HostBoundFaultsExpectTheirRankAndTheirNode) {
  const Campaign c = Campaign::parse(R"({
    "name": "broken-node",
    "incidents": [{"incident_id": "gpu", "trigger": {"at": [9]}, "lifetime": {"until": "recovery"},
                   "retrigger": "every_attempt",
                   "faults": [{"fault_id": "f", "type": "tensor_corruption",
                               "target": {"host": "node-b", "local_rank": 1, "component": "transformer_block",
                                          "index": 0, "surface": "weight"},
                               "parameters": {"operation": "scale", "factor": 4.0}}]}]})");
  const Candidate cand{0, 9, 9, true};
  InjectionRecord r = makeRecord(c, 0, 0, cand, 1);
  r.execution_rank = 3;  // as the Session fills it in: node-b's local rank 1 was rank 3
  r.expected_rank = 3;
  r.transition(RecordStatus::kActive);
  r.verified = true;
  r.actual_iteration = 9;
  r.executor = "test";
  r.transition(RecordStatus::kCompleted);
  LocalizationResult found;
  found.occurrence_id = "gpu@9";
  found.detected = true;
  found.failed_ranks = {3};
  CampaignReport report = evaluate(c, {r}, {found});
  ASSERT_EQ(report.occurrences.size(), 1u);
  EXPECT_TRUE(report.occurrences[0].localized) << ::testing::PrintToString(report.occurrences[0].reasons);
  EXPECT_EQ(report.occurrences[0].expected_ranks, std::vector<std::int64_t>{3});
  EXPECT_FALSE(report.exclusions.has_value());
  EXPECT_TRUE(report.passed());
  scoreExclusions(report, {"node-b"});
  ASSERT_EQ(report.exclusions->size(), 1u);
  EXPECT_TRUE(report.exclusions->front().expected());
  EXPECT_EQ(report.exclusions->front().injections, std::vector<std::string>{"gpu@9/f"});
  EXPECT_TRUE(report.passed());
  scoreExclusions(report, {"node-b", "node-c"});  // node-c held no fault: a false exclusion
  EXPECT_EQ(report.falseExclusions(), 1u);
  EXPECT_FALSE(report.passed());
  const Json j = json::parse(report.toJson(-1), "report").value;
  EXPECT_EQ(j["totals"]["false_exclusions"], 1);
  EXPECT_EQ(j["exclusions"][1]["host"], "node-c");
  EXPECT_NE(formatReportTable(report).find("node-c: FALSE EXCLUSION"), std::string::npos) << formatReportTable(report);
}

TEST(LocalizationResultJson, StrictFields) {
  auto error = [](const std::string& text) {
    try {
      LocalizationResult::fromJson(Json::parse(text), "results[0]");
      return std::string();
    } catch (const InvalidArgument& e) {
      return e.message();
    }
  };
  EXPECT_EQ(error(R"({"occurrence_id": "a@1", "detected": true, "failed_ranks": [2, 1, 2], "kind": "sdc"})"), "");
  EXPECT_EQ(
      error(R"({"occurrence_id": "a@1", "detected": "true"})").rfind("results[0].detected: must be a JSON boolean", 0),
      0u);
  EXPECT_EQ(error(R"({"occurrence_id": "a@1", "detected": true, "failed_resources": "gpu"})")
                .rfind("results[0].failed_resources: must be an array", 0),
            0u);
  EXPECT_EQ(error(R"({"occurrence_id": "a@1", "detected": true, "failed_ranks": ["1"]})")
                .rfind("results[0].failed_ranks[0]: must be a JSON integer", 0),
            0u);
  EXPECT_EQ(error(R"({"occurrence_id": "a@1", "detected": true, "components": [""]})")
                .rfind("results[0].components[0]: must be a non-empty", 0),
            0u);
  EXPECT_EQ(error(R"({"occurrence_id": "a@1", "detected": true, "kind": ""})")
                .rfind("results[0].kind: must be a non-empty", 0),
            0u);
  EXPECT_EQ(error(R"({"occurrence_id": "a@1", "detected": true, "layer_id": -2})")
                .rfind("results[0].layer_id: must be a layer", 0),
            0u);
  EXPECT_EQ(
      error(R"({"occurrence_id": "a@1", "detected": true, "rank": 1})").rfind("results[0].rank: unknown field", 0), 0u);
  const auto r = LocalizationResult::fromJson(
      Json::parse(R"({"occurrence_id": "a@1", "detected": true, "failed_ranks": [2, 1, 2]})"), "r");
  EXPECT_EQ(r.failed_ranks, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(LocalizationResult::fromJson(r.toJson(), "r").toJson(), r.toJson());
}

TEST(InjectionRecordJson, RoundTripAndLifecycle) {
  const Campaign c = Campaign::parse(kEvaluatedManifest);
  InjectionRecord r = makeRecord(c, 0, 0, Candidate{0, 10, 110, true}, 2);
  EXPECT_EQ(r.occurrence_id, "sdc@10#2");
  EXPECT_EQ(r.injection_id, "sdc@10#2/f");
  EXPECT_EQ(r.expected_layer, 12);
  EXPECT_EQ(r.training_iteration, 110);
  EXPECT_THROW(r.transition(RecordStatus::kCompleted), InvalidArgument);  // armed -> completed skips active
  r.transition(RecordStatus::kActive);
  r.verified = true;
  r.activation_evidence = Json{{"elements", 41}};
  EXPECT_TRUE(r.injectionSucceeded());
  r.transition(RecordStatus::kCompleted);
  EXPECT_THROW(r.transition(RecordStatus::kFailed), InvalidArgument);  // terminal
  const InjectionRecord back = InjectionRecord::fromJson(r.toJson(), "records[0]");
  EXPECT_EQ(back.toJson(), r.toJson());
  Json tampered = r.toJson();
  tampered["injection_succeeded"] = false;
  EXPECT_THROW(InjectionRecord::fromJson(tampered, "records[0]"), InvalidArgument);
  tampered = r.toJson();
  tampered["verified"] = 1;
  EXPECT_THROW(InjectionRecord::fromJson(tampered, "records[0]"), InvalidArgument);
}

}  // namespace
}  // namespace lmr::campaign
