#include "lmr/ckpt/recovery.h"

#include <gtest/gtest.h>

#include "lmr/common/error.h"

namespace lmr::ckpt {
namespace {

Manifest manifest() {
  Manifest m;
  m.topology = "t1";
  m.checkpoints = {{"durable-4", 4, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/4", "t1", "", 4},
                   {"durable-8", 8, Tier::kDurable, TrustState::kCandidate, "/ck/8", "t1", "", 8},
                   {"latest-9", 9, Tier::kLatest, TrustState::kLatest, "", "t1", "", -1},
                   {"latest-10", 10, Tier::kLatest, TrustState::kRejected, "", "t1", "", -1}};
  return m;
}

TEST(Recovery, SelectionFollowsTheFailure) {
  const Manifest m = manifest();
  for (Failure f : {Failure::kSdc, Failure::kInaccessible}) {
    auto d = selectRecovery(m, f, 12);
    EXPECT_EQ(d.mode, "rollback_verified");
    EXPECT_EQ(d.checkpoint_id, "durable-4");
    EXPECT_EQ(d.source, "RECOVERY_VERIFIED");
    EXPECT_TRUE(d.available);
    EXPECT_EQ(d.decided_at, 12);
  }
  auto d = selectRecovery(m, Failure::kStraggler, 12);
  EXPECT_EQ(d.mode, "resume_latest");
  EXPECT_EQ(d.checkpoint_id, "latest-9");  // the rejected latest-10 is never chosen
  EXPECT_EQ(d.tier, "latest");
  EXPECT_EQ(selectRecovery(m, Failure::kHang, 12, EmergencyReplay::kClean).checkpoint_id, "latest-9");
  for (EmergencyReplay e : {EmergencyReplay::kNotRun, EmergencyReplay::kIncomplete, EmergencyReplay::kSdc}) {
    EXPECT_EQ(selectRecovery(m, Failure::kHang, 12, e).checkpoint_id, "durable-4");
    EXPECT_EQ(selectRecovery(m, Failure::kUncertain, 12, e).checkpoint_id, "durable-4");
  }
}

TEST(Recovery, AFastTierCheckpointThatCannotBeRestoredFallsBackToTheDurableTier) {
  Manifest m = manifest();
  m.checkpoints[2].state = TrustState::kRecoveryVerified;  // latest-9: what a straggler rollback picks
  RecoveryDecision first = selectRecovery(m, Failure::kStraggler, 12, EmergencyReplay::kNotRun, 5.0);
  first.action = "exclude_and_rollback";
  first.blamed_hosts = {"node-b"};
  first.restart = true;
  ASSERT_EQ(first.checkpoint_id, "latest-9");
  const RecoveryDecision d = fallBackToDurable(m, first, "no rank holds the snapshot of rank(s) 3", 6.0);
  EXPECT_EQ(d.checkpoint_id, "durable-8");  // the newest usable durable one for a straggler
  EXPECT_EQ(d.tier, "durable");
  EXPECT_EQ(d.action, "exclude_and_rollback");
  EXPECT_EQ(d.blamed_hosts, first.blamed_hosts);
  EXPECT_TRUE(d.restart);
  EXPECT_EQ(d.decided_at, 12);
  EXPECT_NE(d.reason.find("latest-9 could not be restored (no rank holds the snapshot of rank(s) 3): the durable "
                          "tier's durable-8 instead"),
            std::string::npos)
      << d.reason;
  m.checkpoints.resize(2);
  m.checkpoints[0].state = TrustState::kRejected;
  m.checkpoints[1].state = TrustState::kRejected;
  EXPECT_FALSE(fallBackToDurable(m, first, "gone").available);
}

TEST(Recovery, TheDecisionSaysWhereEachRankRestoredFrom) {
  RecoveryDecision d;
  d.reason = "detected SDC";
  d = withRestoreSources(d, {"own memory", "own memory", "a replica from rank 0", "own memory"});
  EXPECT_EQ(d.reason, "detected SDC; restored: own memory on ranks 0, 1, 3; a replica from rank 0 on rank 2");
  EXPECT_EQ(withRestoreSources(d, {}).reason, d.reason);
}

TEST(Recovery, TaintedStateNeverResumesFromUnverified) {
  Manifest m = manifest();
  m.tainted_since = 9;
  EXPECT_EQ(selectRecovery(m, Failure::kStraggler, 12).checkpoint_id, "durable-4");
}

TEST(Recovery, OtherTopologiesAndNothingVerifiedAreUnavailable) {
  Manifest m = manifest();
  m.checkpoints[0].topology = "t0";
  auto d = selectRecovery(m, Failure::kSdc, 12);
  EXPECT_FALSE(d.available);
  EXPECT_EQ(d.mode, "unavailable");
  EXPECT_EQ(d.step, -1);
  EXPECT_NE(d.reason.find("no RECOVERY_VERIFIED checkpoint"), std::string::npos) << d.reason;
  EXPECT_THROW(requireTopology(m.checkpoints[0], "t1"), InvalidArgument);
  EXPECT_NO_THROW(requireTopology(m.checkpoints[1], "t1"));
  EXPECT_FALSE(selectRecovery(Manifest{}, Failure::kStraggler, 0).available);
}

// The same model on another layout (a node excluded: fewer ranks) is selected from the durable
// tier only, and loads only through a back end that reshards; another model never.
TEST(Recovery, AnotherLayoutOfTheSameModelResumesFromTheDurableTier) {
  EXPECT_EQ(matchTopology("m1/l6", "m1/l6"), TopologyMatch::kSame);
  EXPECT_EQ(matchTopology("m1/l6", "m1/l4"), TopologyMatch::kResharded);
  EXPECT_EQ(matchTopology("m1/l6", "m2/l6"), TopologyMatch::kOtherModel);
  EXPECT_EQ(matchTopology("t1", "t1"), TopologyMatch::kSame);
  EXPECT_EQ(matchTopology("m1", "m1/l4"), TopologyMatch::kOtherModel);  // written before the split: never a reshard
  Manifest m;
  m.topology = "m1/l4";
  m.checkpoints = {{"durable-4", 4, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/4", "m1/l6", "", 4},
                   {"latest-6", 6, Tier::kLatest, TrustState::kRecoveryVerified, "", "m1/l6", "", 6},
                   {"durable-5", 5, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/5", "m2/l4", "", 5}};
  EXPECT_EQ(selectRecovery(m, Failure::kSdc, 9).checkpoint_id, "durable-4");
  EXPECT_EQ(selectRecovery(m, Failure::kStraggler, 9).checkpoint_id, "durable-4");
  EXPECT_TRUE(requireTopology(m.checkpoints[0], "m1/l4", true));
  EXPECT_FALSE(requireTopology(m.checkpoints[0], "m1/l6", true));
  auto failure = [](auto&& call) {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(failure([&] { requireTopology(m.checkpoints[0], "m1/l4"); }).find("does not reshard"), std::string::npos);
  EXPECT_NE(failure([&] { requireTopology(m.checkpoints[1], "m1/l4", true); }).find("fast tier"), std::string::npos);
  EXPECT_NE(failure([&] { requireTopology(m.checkpoints[2], "m1/l4", true); }).find("another model"),
            std::string::npos);
  // durable_only: a fast-tier snapshot at the same step gives way.
  Manifest same = manifest();
  same.checkpoints[1].state = TrustState::kRecoveryVerified;
  same.checkpoints.push_back({"latest-8", 8, Tier::kLatest, TrustState::kRecoveryVerified, "", "t1", "", -1});
  EXPECT_EQ(selectRecovery(same, Failure::kSdc, 12).checkpoint_id, "latest-8");
  const auto durable = selectRecovery(same, Failure::kSdc, 12, EmergencyReplay::kNotRun, 0.0, true);
  EXPECT_EQ(durable.checkpoint_id, "durable-8");
  EXPECT_NE(durable.reason.find("durable tier only"), std::string::npos) << durable.reason;
}

TEST(Recovery, NamesParse) {
  EXPECT_EQ(parseFailure("hang"), Failure::kHang);
  EXPECT_EQ(parseEmergencyReplay("clean"), EmergencyReplay::kClean);
  EXPECT_THROW(parseFailure("Hang"), InvalidArgument);
  EXPECT_THROW(parseEmergencyReplay(""), InvalidArgument);
}

TEST(Recovery, OnlyAnSdcSendsTheRanksAwayForARelaunch) {
  const Manifest m = manifest();
  EXPECT_TRUE(selectRecovery(m, Failure::kSdc, 11).restart);
  EXPECT_TRUE(selectRecovery(Manifest{}, Failure::kSdc, 11).restart);  // unavailable: the caller says so
  for (Failure f : {Failure::kInaccessible, Failure::kStraggler, Failure::kHang, Failure::kUncertain})
    EXPECT_FALSE(selectRecovery(m, f, 11).restart) << name(f);
}

TEST(Recovery, AStartingJobResumesThePendingDecisionOrAnUndiagnosedFailure) {
  Manifest empty;
  EXPECT_FALSE(planResume(empty, "t1", 5.0).has_value());

  Manifest m = manifest();
  m.topology = "";
  auto plan = planResume(m, "t1", 5.0);  // no decision: a crash nobody diagnosed
  ASSERT_TRUE(plan.has_value());
  EXPECT_TRUE(plan->undiagnosed);
  EXPECT_EQ(plan->decision.failure, "uncertain");
  EXPECT_EQ(plan->decision.checkpoint_id, "durable-4");  // uncertain, not replayed: verified only
  EXPECT_EQ(plan->decision.decided_at, 10);
  EXPECT_EQ(m.topology, "t1");

  m.decision = selectRecovery(m, Failure::kStraggler, 9);
  ASSERT_EQ(m.decision->checkpoint_id, "latest-9");
  plan = planResume(m, "t1", 6.0);
  ASSERT_TRUE(plan.has_value());
  EXPECT_FALSE(plan->undiagnosed);
  EXPECT_EQ(plan->decision, *m.decision);

  m.decision->status = "applied";  // already loaded once: a later crash is undiagnosed again
  EXPECT_TRUE(planResume(m, "t1", 7.0)->undiagnosed);
  m.decision->status = "pending";
  m.checkpoints.erase(m.checkpoints.begin() + 2);  // its checkpoint is gone
  EXPECT_TRUE(planResume(m, "t1", 8.0)->undiagnosed);
}

}  // namespace
}  // namespace lmr::ckpt
