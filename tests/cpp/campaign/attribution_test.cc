#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lmr/campaign/attribution.h"
#include "lmr/campaign/schedule.h"

namespace lmr::campaign {
namespace {

// A bounded optimizer-state fault on rank 2, a weight fault on rank 1 until recovery, and a
// compute fault on rank 3 later on.
const char* kManifest = R"({
  "name": "residuals",
  "incidents": [
    {"incident_id": "adam", "trigger": {"at": [10]}, "lifetime": {"iterations": 4},
     "faults": [{"fault_id": "m", "type": "tensor_corruption",
                 "target": {"rank": 2, "component": "transformer_block", "index": 0, "surface": "optimizer_state"},
                 "parameters": {"operation": "scale", "factor": 50, "parameter": "w1.weight", "state_key": "exp_avg"}}]},
    {"incident_id": "weight", "trigger": {"at": [30]}, "lifetime": {"until": "recovery"},
     "faults": [{"fault_id": "w", "type": "tensor_corruption",
                 "target": {"rank": 1, "component": "transformer_block", "index": 1, "surface": "weight"},
                 "parameters": {"operation": "scale", "factor": 4, "parameter": "wq.weight"}}]},
    {"incident_id": "out", "trigger": {"at": [20]}, "lifetime": {"iterations": 2},
     "faults": [{"fault_id": "o", "type": "tensor_corruption",
                 "target": {"rank": 3, "component": "transformer_block", "index": 1, "surface": "output"},
                 "parameters": {"operation": "sign_flip"}}]}
  ]
})";

class Attributions : public ::testing::Test {
 protected:
  Attributions() : campaign(Campaign::parse(kManifest)) {
    for (std::size_t i = 0; i < campaign.incidents().size(); ++i) {
      const Incident& inc = campaign.incidents()[i];
      const std::int64_t pos = inc.trigger.firstCandidate();
      InjectionRecord r = makeRecord(campaign, i, 0, Candidate{i, pos, pos, true}, 1);
      r.transition(RecordStatus::kActive);
      r.verified = true;
      r.actual_iteration = pos;
      r.executor = "test";
      records.push_back(r);
    }
  }
  std::vector<Explained> explain(const std::vector<Attribution>& a, const std::vector<std::int64_t>& recoveries = {}) {
    return explainAttributions(campaign, records, a, recoveries);
  }
  Campaign campaign;
  std::vector<InjectionRecord> records;
};

Attribution sdc(std::int64_t step, std::int64_t rank, const std::string& source) {
  const bool state = source.ends_with(".params") || source.ends_with(".state");
  return Attribution{step, rank, source, "sdc", state};
}

TEST_F(Attributions, WindowsFollowLifetimesAndRecoveries) {
  const auto w = occurrenceWindows(campaign, records, {45});
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].occurrence_id, "adam@10");
  EXPECT_EQ(w[0].first, 10);
  EXPECT_EQ(w[0].last, 13);
  EXPECT_EQ(w[0].state_ranks, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(w[1].occurrence_id, "out@20");
  EXPECT_TRUE(w[1].state_ranks.empty());
  EXPECT_EQ(w[2].last, 44);  // until recovery: the recovery at 45 ends it
  EXPECT_FALSE(occurrenceWindows(campaign, records)[2].last.has_value());
}

TEST_F(Attributions, StateEvidenceAfterAStateFaultIsItsResidual) {
  const auto e = explain({
      sdc(12, 2, "optimizer.0.state"),   // inside the window
      sdc(16, 2, "hidden.0.params"),     // after it: the replica stayed diverged
      sdc(21, 2, "optimizer.1.params"),  // during another occurrence, on a rank it does not name
      sdc(21, 3, "hidden.1.output"),     // that occurrence itself
      sdc(16, 2, "hidden.0.output"),     // compute evidence is never residual
      sdc(16, 0, "hidden.0.params"),     // another rank
      sdc(5, 2, "hidden.0.params"),      // before the fault
  });
  ASSERT_EQ(e.size(), 7u);
  EXPECT_EQ(e[0].explanation, Explanation::kOccurrence);
  EXPECT_EQ(e[0].occurrence_id, "adam@10");
  EXPECT_EQ(e[1].explanation, Explanation::kResidual);
  EXPECT_EQ(e[1].occurrence_id, "adam@10");
  EXPECT_EQ(e[2].explanation, Explanation::kResidual);
  EXPECT_EQ(e[3].explanation, Explanation::kOccurrence);
  EXPECT_EQ(e[3].occurrence_id, "out@20");
  EXPECT_EQ(e[4].explanation, Explanation::kUnexplained);
  EXPECT_EQ(e[4].occurrence_id, "");
  EXPECT_EQ(e[5].explanation, Explanation::kUnexplained);
  EXPECT_EQ(e[6].explanation, Explanation::kUnexplained);
  EXPECT_EQ(name(e[1].explanation), "residual");
}

TEST_F(Attributions, ARecoveryEndsTheResidual) {
  const auto e = explain({sdc(16, 2, "hidden.0.params"), sdc(26, 2, "hidden.0.params")}, {25});
  EXPECT_EQ(e[0].explanation, Explanation::kResidual);
  EXPECT_EQ(e[1].explanation, Explanation::kUnexplained);
}

TEST_F(Attributions, WrongRankInsideAWindowStaysWithTheOccurrence) {
  // Scoring then reports the occurrence as mislocalized; the attribution is not "unexplained".
  const auto e = explain({sdc(20, 0, "hidden.1.output"), Attribution{21, 0, "timing", "straggler", false}});
  EXPECT_EQ(e[0].explanation, Explanation::kOccurrence);
  EXPECT_EQ(e[0].occurrence_id, "out@20");
  EXPECT_EQ(e[1].occurrence_id, "out@20");
}

}  // namespace
}  // namespace lmr::campaign
