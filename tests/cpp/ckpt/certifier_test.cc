#include "lmr/ckpt/certifier.h"

#include <gtest/gtest.h>

#include "lmr/common/error.h"

namespace lmr::ckpt {
namespace {

const std::vector<std::string> kCatalog = {"embedding", "hidden.0", "hidden.1", "output"};

CheckOutcome ok(std::int64_t step, std::vector<std::string> recipes, Outcome o = Outcome::kHealthy) {
  return CheckOutcome{step, o, std::move(recipes), ""};
}

Checkpoint durable(std::int64_t step, TrustState state) {
  return Checkpoint{
      "durable-" + std::to_string(step), step, Tier::kDurable, state, "/ck/" + std::to_string(step), "topo", "", -1};
}

Checkpoint latest(std::int64_t step) {
  return Checkpoint{"latest-" + std::to_string(step), step, Tier::kLatest, TrustState::kLatest, "", "topo", "", -1};
}

TrustState stateOf(const Certifier& c, const std::string& id) { return c.manifest().find(id)->state; }

// Rotating catalog: one recipe per check. Steps 1-4 cover it (candidate at 4), 5-8 again
// (the candidate is promoted at 8 and the state at 8 becomes the next candidate).
TEST(Certifier, RotatingCatalogMakesCandidateThenPromotesIt) {
  Certifier c(kCatalog, Manifest{});
  for (int s = 1; s <= 3; ++s) {
    auto ch = c.observe(ok(s, {kCatalog[s - 1]}));
    EXPECT_FALSE(ch.capture.durable) << s;
    EXPECT_TRUE(ch.capture.latest);
  }
  auto ch = c.observe(ok(4, {"output"}));
  ASSERT_TRUE(ch.capture.durable);
  EXPECT_EQ(ch.capture.state, TrustState::kCandidate);
  EXPECT_TRUE(ch.promoted.empty());
  c.captured(durable(4, ch.capture.state));
  for (int s = 5; s <= 7; ++s) EXPECT_FALSE(c.observe(ok(s, {kCatalog[s - 5]})).capture.durable);
  EXPECT_EQ(stateOf(c, "durable-4"), TrustState::kCandidate);
  ch = c.observe(ok(8, {"output"}));
  EXPECT_EQ(ch.promoted, std::vector<std::string>{"durable-4"});
  EXPECT_EQ(stateOf(c, "durable-4"), TrustState::kRecoveryVerified);
  EXPECT_EQ(c.manifest().find("durable-4")->certified_at, 8);
  EXPECT_EQ(ch.capture.state, TrustState::kCandidate);
}

TEST(Certifier, DenseAcceptedCheckVerifiesImmediately) {
  Certifier c(kCatalog, Manifest{});
  auto ch = c.observe(ok(10, kCatalog));
  ASSERT_TRUE(ch.capture.durable);
  EXPECT_EQ(ch.capture.state, TrustState::kRecoveryVerified);
  c.captured(durable(10, ch.capture.state));
  EXPECT_EQ(c.manifest().find("durable-10")->certified_at, 10);
}

// A dynamic catalog (MoE regimes): even a check covering all of it makes only a candidate,
// which the next complete accepted cycle promotes.
TEST(Certifier, DynamicCatalogNeedsTwoCompleteCycles) {
  Certifier c(kCatalog, Manifest{}, 0, /*dynamic=*/true);
  auto ch = c.observe(ok(10, kCatalog));
  ASSERT_TRUE(ch.capture.durable);
  EXPECT_EQ(ch.capture.state, TrustState::kCandidate);
  c.captured(durable(10, ch.capture.state));
  ch = c.observe(ok(20, kCatalog));
  EXPECT_EQ(ch.promoted, std::vector<std::string>{"durable-10"});
  EXPECT_EQ(stateOf(c, "durable-10"), TrustState::kRecoveryVerified);
  EXPECT_EQ(ch.capture.state, TrustState::kCandidate);
}

TEST(Certifier, SdcRejectsEveryUnvalidatedCheckpointAndTaintsUntilRecovery) {
  Certifier c(kCatalog, Manifest{});
  c.captured(durable(4, c.observe(ok(4, kCatalog)).capture.state));  // verified
  c.observe(ok(5, {"embedding"}));
  c.captured(latest(5));
  for (int s = 6; s <= 8; ++s) c.observe(ok(s, {kCatalog[s - 5]}));
  c.captured(durable(8, TrustState::kCandidate));
  auto ch = c.observe(CheckOutcome{9, Outcome::kSdc, {}, "hidden.1.params"});
  EXPECT_FALSE(ch.capture.durable);
  EXPECT_FALSE(ch.capture.latest);
  EXPECT_EQ(ch.rejected, (std::vector<std::string>{"latest-5", "durable-8"}));
  EXPECT_EQ(stateOf(c, "durable-4"), TrustState::kRecoveryVerified);
  EXPECT_EQ(c.manifest().tainted_since, 9);
  // Later checks agree (another recipe) but the state stays tainted.
  for (int s = 10; s <= 20; ++s) {
    auto later = c.observe(ok(s, kCatalog));
    EXPECT_FALSE(later.capture.durable) << s;
    EXPECT_FALSE(later.capture.latest) << s;
    EXPECT_TRUE(later.promoted.empty());
  }
  EXPECT_FALSE(c.boundary(21).latest);
  auto abandoned = c.recovered("durable-4");
  ASSERT_EQ(abandoned.size(), 2u);  // the rejected ones after step 4 leave with the abandoned timeline
  EXPECT_EQ(c.manifest().checkpoints.size(), 1u);
  EXPECT_FALSE(c.manifest().tainted_since);
  EXPECT_EQ(c.manifest().generation, 1);
  EXPECT_TRUE(c.boundary(5).latest);
}

TEST(Certifier, InconclusiveCountsForNothingAndBlocksTheCurrentState) {
  Certifier c(kCatalog, Manifest{});
  c.observe(ok(1, {"embedding", "hidden.0"}));
  auto ch = c.observe(CheckOutcome{2, Outcome::kInconclusive, {"hidden.1"}, "missing_capture"});
  EXPECT_FALSE(ch.capture.durable);
  EXPECT_FALSE(ch.capture.latest);
  EXPECT_EQ(c.covered(), (std::vector<std::string>{"embedding", "hidden.0"}));
  EXPECT_FALSE(c.observe(ok(3, {"output"})).capture.durable);  // hidden.1 still missing
  EXPECT_TRUE(c.observe(ok(4, {"hidden.1"})).capture.durable);
  EXPECT_FALSE(c.manifest().tainted_since);
}

TEST(Certifier, StragglerWithoutSdcStillCertifiesAndReportsIt) {
  Certifier c(kCatalog, Manifest{});
  auto ch = c.observe(ok(3, kCatalog, Outcome::kStraggler));
  EXPECT_TRUE(ch.capture.durable);
  EXPECT_TRUE(ch.capture.performance_fault);
  EXPECT_EQ(ch.capture.state, TrustState::kRecoveryVerified);
}

TEST(Certifier, SdcDuringTheNextCycleRejectsTheCandidate) {
  Certifier c(kCatalog, Manifest{});
  for (int s = 1; s <= 4; ++s) c.observe(ok(s, {kCatalog[s - 1]}));
  c.captured(durable(4, TrustState::kCandidate));
  c.observe(ok(5, {"embedding"}));
  auto ch = c.observe(CheckOutcome{6, Outcome::kSdc, {}, "hidden.0.output"});
  EXPECT_EQ(ch.rejected, std::vector<std::string>{"durable-4"});
  EXPECT_NE(c.manifest().find("durable-4")->reason.find("SDC detected at step 6"), std::string::npos);
}

TEST(Certifier, RecoveryAbandonsLaterCheckpointsAndRestartsTheCycle) {
  Certifier c(kCatalog, Manifest{});
  c.captured(durable(4, c.observe(ok(4, kCatalog)).capture.state));
  c.observe(ok(5, {"embedding", "hidden.0"}));
  c.captured(latest(5));
  c.captured(latest(6));
  auto abandoned = c.recovered("durable-4");
  ASSERT_EQ(abandoned.size(), 2u);
  EXPECT_EQ(abandoned[0].id, "latest-5");
  EXPECT_EQ(abandoned[1].id, "latest-6");
  EXPECT_TRUE(c.covered().empty());
  // Steps restart from the checkpoint's, and the same ids can be captured again.
  EXPECT_NO_THROW(c.observe(ok(5, {"embedding"})));
  EXPECT_NO_THROW(c.captured(latest(5)));
}

TEST(Certifier, RefusesBadInput) {
  EXPECT_THROW(Certifier({}, Manifest{}), InvalidArgument);
  EXPECT_THROW(Certifier({"a", "a"}, Manifest{}), InvalidArgument);
  Certifier c(kCatalog, Manifest{});
  c.observe(ok(5, {"embedding"}));
  EXPECT_THROW(c.observe(ok(4, {"embedding"})), InvalidArgument);
  c.captured(latest(5));
  EXPECT_THROW(c.captured(latest(5)), InvalidArgument);
  EXPECT_THROW(c.captured(latest(3)), InvalidArgument);
  EXPECT_THROW(c.recovered("nope"), InvalidArgument);
  c.observe(CheckOutcome{6, Outcome::kSdc, {}, ""});
  EXPECT_THROW(c.recovered("latest-5"), InvalidArgument);  // rejected
}

TEST(Certifier, ContinuesFromAPersistedManifest) {
  Manifest m;
  m.checkpoints = {durable(4, TrustState::kCandidate)};
  Certifier c(kCatalog, m, 4);  // the job continues from step 4
  EXPECT_THROW(c.observe(ok(3, kCatalog)), InvalidArgument);  // before it
  auto ch = c.observe(ok(8, kCatalog));
  EXPECT_EQ(ch.promoted, std::vector<std::string>{"durable-4"});
}

TEST(Certifier, AJobThatStartsOverDropsTheOtherTimeline) {
  Manifest m;
  m.checkpoints = {durable(4, TrustState::kRecoveryVerified), durable(8, TrustState::kCandidate), latest(9)};
  m.tainted_since = 9;
  Certifier c(kCatalog, m, 0);  // a restart from step 0 after a crash with nothing to resume
  ASSERT_EQ(c.abandoned().size(), 3u);
  EXPECT_TRUE(c.manifest().checkpoints.empty());
  EXPECT_FALSE(c.manifest().tainted_since);
  for (int s = 1; s <= 8; ++s) c.observe(ok(s, {kCatalog[(s - 1) % 4]}));  // no promotion of durable-8
  EXPECT_TRUE(c.manifest().checkpoints.empty());
  Certifier tainted(kCatalog, m, 10);  // continues the tainted state: still tainted
  EXPECT_EQ(tainted.manifest().tainted_since, 9);
  EXPECT_TRUE(tainted.abandoned().empty());
}

TEST(Classify, WhatOneRanksCheckSaysForTrust) {
  CheckEvidence healthy;
  healthy.checked_recipes = {"embedding", "hidden.1"};
  auto o = classify(healthy, kCatalog);
  EXPECT_EQ(o.outcome, Outcome::kHealthy);
  EXPECT_EQ(o.accepted, (std::vector<bool>{true, false, true, false}));

  CheckEvidence slow = healthy;
  slow.straggler = true;
  EXPECT_EQ(classify(slow, kCatalog).outcome, Outcome::kStraggler);

  CheckEvidence sdc = healthy;
  sdc.sdc_sources = {"hidden.1.output"};
  o = classify(sdc, kCatalog);
  EXPECT_EQ(o.outcome, Outcome::kSdc);
  EXPECT_EQ(o.reason, "SDC in hidden.1.output");
  EXPECT_EQ(o.accepted, std::vector<bool>(4, false));

  // Two replicas whose held state differs: SDC. Recomputed values that split: inconclusive.
  CheckEvidence state_split = healthy;
  state_split.inconclusive = true;
  state_split.inconclusive_recipes = {"hidden.1"};
  state_split.inconclusive_reasons = {{"hidden.1.params", "no_majority: the peers disagree"}};
  o = classify(state_split, kCatalog);
  EXPECT_EQ(o.outcome, Outcome::kSdc);
  EXPECT_EQ(o.reason, "peers disagree with no majority in hidden.1.params");
  CheckEvidence value_split = state_split;
  value_split.inconclusive_reasons = {{"hidden.1.output", "no_majority: the peers disagree"}};
  o = classify(value_split, kCatalog);
  EXPECT_EQ(o.outcome, Outcome::kInconclusive);
  EXPECT_EQ(o.accepted, (std::vector<bool>{true, false, false, false}));  // hidden.1 was inconclusive
  EXPECT_EQ(o.reason, "hidden.1.output: no_majority: the peers disagree");

  CheckEvidence missing;
  missing.inconclusive = true;
  EXPECT_EQ(classify(missing, kCatalog).reason, "inconclusive");
  EXPECT_EQ(parseOutcome("sdc"), Outcome::kSdc);
  EXPECT_THROW(parseOutcome("SDC"), InvalidArgument);
}

// The boundary rules the Python certifier obeys: observe at a check, or at a state-integrity
// SDC whose peers span the world (once: a tainted state adds nothing); otherwise capture only
// where a fast-tier snapshot is due.
TEST(Certifier, TheBoundaryDecisionSaysWhatTheCallerDoes) {
  Certifier c(kCatalog, Manifest{}, 0, false, 4);
  EXPECT_EQ(c.atBoundary({3, false, false}), BoundaryAction::kSkip);
  EXPECT_EQ(c.atBoundary({4, false, false}), BoundaryAction::kCapture);
  EXPECT_EQ(c.atBoundary({3, true, false}), BoundaryAction::kObserve);
  EXPECT_EQ(c.atBoundary({3, false, true}), BoundaryAction::kObserve);
  EXPECT_TRUE(c.boundary(4).snapshot);
  EXPECT_FALSE(c.boundary(5).snapshot);
  EXPECT_TRUE(c.boundary(5).latest);
  EXPECT_TRUE(c.observe(ok(8, {"embedding"})).capture.snapshot);
  EXPECT_FALSE(c.observe(ok(9, {"hidden.0"})).capture.snapshot);
  auto ch = c.observe(ok(10, {}, Outcome::kSdc));
  EXPECT_TRUE(ch.recover);  // this check tainted the state: decide now
  EXPECT_FALSE(c.observe(ok(11, {}, Outcome::kSdc)).recover);
  EXPECT_EQ(c.atBoundary({12, false, true}), BoundaryAction::kCapture);  // tainted; due at 12, boundary() refuses
  EXPECT_FALSE(c.boundary(12).latest);
  EXPECT_FALSE(c.boundary(12).snapshot);
  EXPECT_EQ(name(BoundaryAction::kObserve), "observe");

  Certifier none(kCatalog, Manifest{});
  EXPECT_EQ(none.atBoundary({4, false, false}), BoundaryAction::kSkip);
  EXPECT_FALSE(none.boundary(4).snapshot);
  EXPECT_THROW(Certifier(kCatalog, Manifest{}, 0, false, -1), InvalidArgument);
  // A completed cycle's capture goes to the fast tier too, off its interval (CANDIDATE there).
  Certifier cycle(kCatalog, Manifest{}, 0, false, 4);
  const auto done = cycle.observe(ok(7, kCatalog));
  EXPECT_TRUE(done.capture.durable);
  EXPECT_TRUE(done.capture.snapshot);
}

TEST(Certifier, ADenseCaptureIsCommittedAtOnceAndAPendingDecisionPinsItsSnapshot) {
  Manifest m;
  m.topology = "topo";
  Certifier c(kCatalog, m, 0, false, 1);
  EXPECT_EQ(c.captured(latest(1)), std::vector<std::string>{});
  EXPECT_EQ(c.captured(durable(2, TrustState::kCandidate)), std::vector<std::string>{});
  EXPECT_EQ(c.captured(durable(3, TrustState::kRecoveryVerified)), std::vector<std::string>{"durable-3"});
  EXPECT_EQ(c.captured(latest(4)), std::vector<std::string>{});
  ASSERT_EQ(c.snapshots().size(), 2u);
  EXPECT_EQ(c.snapshots()[1].id, "latest-4");
  RecoveryDecision d = selectRecovery(c.manifest(), Failure::kStraggler, 4);
  ASSERT_EQ(d.checkpoint_id, "latest-4");
  c.setDecision(d);
  EXPECT_FALSE(c.removed("latest-4"));  // the relaunch loads it
  EXPECT_TRUE(c.removed("latest-1"));
  EXPECT_EQ(c.snapshots().size(), 1u);
  d.status = "applied";
  c.setDecision(d);
  EXPECT_TRUE(c.removed("latest-4"));
  EXPECT_TRUE(c.snapshots().empty());
}

TEST(Certifier, AnEmergencyReplayIsCleanOnlyWhenItAcceptedEverything) {
  EXPECT_EQ(emergencyVerdict(Outcome::kSdc, {true, true}), EmergencyReplay::kSdc);
  EXPECT_EQ(emergencyVerdict(Outcome::kHealthy, {true, true}), EmergencyReplay::kClean);
  EXPECT_EQ(emergencyVerdict(Outcome::kStraggler, {true, true}), EmergencyReplay::kClean);
  EXPECT_EQ(emergencyVerdict(Outcome::kHealthy, {true, false}), EmergencyReplay::kIncomplete);
  EXPECT_EQ(emergencyVerdict(Outcome::kInconclusive, {true, true}), EmergencyReplay::kIncomplete);
}

}  // namespace
}  // namespace lmr::ckpt
