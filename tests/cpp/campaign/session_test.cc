#include "lmr/campaign/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"

namespace lmr::campaign {
namespace {

using json::Json;

// One incident "inc" with one fault "f" on `rank`, triggered at `at`, lasting `lifetime`.
Json manifest(Json lifetime, Json trigger = Json{{"at", {3}}}, std::int64_t rank = 0, const char* surface = "weight") {
  return Json{
      {"name", "session"},
      {"incidents",
       {{{"incident_id", "inc"},
         {"trigger", trigger},
         {"lifetime", lifetime},
         {"faults",
          {{{"fault_id", "f"},
            {"type", "tensor_corruption"},
            {"target", {{"rank", rank}, {"component", "transformer_block"}, {"index", 0}, {"surface", surface}}},
            {"parameters", {{"operation", "single_bitflip"}}}}}}}}}};
}

std::shared_ptr<Campaign> parse(const Json& m) { return std::make_shared<Campaign>(Campaign::parse(m.dump())); }

struct Fixture {
  std::shared_ptr<Campaign> campaign;
  std::shared_ptr<MemoryStateStore> store = std::make_shared<MemoryStateStore>();

  std::unique_ptr<Session> session(std::int64_t completed = 0, std::int64_t rank = 0,
                                   std::optional<std::int64_t> world = std::nullopt,
                                   const std::vector<ExecutorInfo>& executors = {}) {
    auto s = std::make_unique<Session>(campaign, store, rank, world, completed);
    s->prepare(executors);
    s->start();
    return s;
  }
};

std::string errorOf(const auto& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

InjectionRecord only(const std::vector<InjectionRecord>& records) {
  EXPECT_EQ(records.size(), 1u);
  return records.empty() ? InjectionRecord{} : records.front();
}

TEST(Session, ArmsAtItsIterationWithIdsRecordAndWindow) {
  Fixture fx{parse(manifest({{"iterations", 2}}))};
  auto s = fx.session();
  EXPECT_EQ(s->nextDue(), 3);
  EXPECT_TRUE(s->arm(2).actions.empty());  // nothing due before 3
  const ArmPlan plan = s->arm(3);
  ASSERT_EQ(plan.actions.size(), 1u);
  const Action& a = plan.actions[0];
  EXPECT_EQ(a.occurrence_id, "inc@3");
  EXPECT_EQ(a.injection_id, "inc@3/f");
  EXPECT_EQ(a.iteration, 3);
  EXPECT_EQ(a.attempt, 1);
  EXPECT_FALSE(a.executor.has_value());
  EXPECT_TRUE(plan.all_safe);
  EXPECT_EQ(only(s->records()).status, RecordStatus::kArmed);

  EXPECT_TRUE(s->activated(a.injection_id, "builtin", true, Json{{"changed", 1}}, "", false));
  EXPECT_EQ(only(s->records()).status, RecordStatus::kActive);
  EXPECT_EQ(only(s->records()).actual_iteration, 3);
  EXPECT_TRUE(s->expired(3).empty());  // iterations 3 and 4
  EXPECT_EQ(s->expired(4), std::vector<std::string>{"inc@3/f"});

  s->settle(a.injection_id, false, "", true, Json{{"changed", 1}}, "", Json{{"restored_exactly", 1}});
  const InjectionRecord r = only(s->records());
  EXPECT_EQ(r.status, RecordStatus::kCompleted);
  EXPECT_TRUE(r.verified);
  EXPECT_EQ(r.deactivation_evidence, (Json{{"restored_exactly", 1}}));
  EXPECT_TRUE(s->armedIds().empty());
  // The journal in the store holds the claim.
  EXPECT_EQ(fx.store->load()->attemptsAt("inc", 3), 1);
}

TEST(Session, RetriggerPolicyHoldsAcrossARestartSharingTheStore) {
  Json once = manifest({{"iterations", 1}});
  Fixture fx{parse(once)};
  fx.session()->arm(3);
  // A replacement worker resumes from iteration 2 against the same journal.
  EXPECT_TRUE(fx.session(2)->arm(3).actions.empty());

  Json every = once;
  every["incidents"][0]["retrigger"] = "every_attempt";
  Fixture fy{parse(every)};
  fy.session()->arm(3);
  const ArmPlan again = fy.session(2)->arm(3);
  ASSERT_EQ(again.actions.size(), 1u);
  EXPECT_EQ(again.actions[0].attempt, 2);
  EXPECT_EQ(again.actions[0].injection_id, "inc@3#2/f");
}

// A broken GPU's fault follows its node: after the job renumbers its ranks the same node's rank
// runs it, and once the node left the job nobody does.
TEST(Session, AHostBoundFaultFollowsItsNode) {
  Json m = manifest({{"iterations", 1}});
  m["incidents"][0]["retrigger"] = "every_attempt";
  m["incidents"][0]["faults"][0]["target"].erase("rank");
  m["incidents"][0]["faults"][0]["target"]["host"] = "node-b";
  m["incidents"][0]["faults"][0]["target"]["local_rank"] = 1;
  Fixture fx{parse(m)};
  const std::vector<RankPlace> first = {{"node-a", 0}, {"node-a", 1}, {"node-b", 0}, {"node-b", 1}};
  std::vector<std::int64_t> runs;
  for (std::int64_t rank = 0; rank < 4; ++rank) {
    Session s(fx.campaign, std::make_shared<MemoryStateStore>(), rank, 4, 0);
    s.setPlacement(first);
    if (!s.prepare({}).empty()) runs.push_back(rank);
  }
  EXPECT_EQ(runs, std::vector<std::int64_t>{3});
  // Renumbered: node-b now holds ranks 0 and 1.
  Session moved(fx.campaign, fx.store, 1, 4, 0);
  moved.setPlacement({{"node-b", 0}, {"node-b", 1}, {"node-c", 0}, {"node-c", 1}});
  ASSERT_EQ(moved.prepare({}).size(), 1u);
  moved.start();
  ASSERT_EQ(moved.arm(3).actions.size(), 1u);
  const InjectionRecord r = only(moved.records());
  EXPECT_EQ(r.execution_rank, 1);
  EXPECT_EQ(r.expected_rank, std::optional<std::int64_t>(1));
  EXPECT_EQ(r.expected_host, std::optional<std::string>("node-b"));
  EXPECT_EQ(InjectionRecord::fromJson(r.toJson(), "r").expected_host, r.expected_host);
  // node-b excluded: no rank runs it, and the world check does not count it.
  Session gone(fx.campaign, std::make_shared<MemoryStateStore>(), 0, 2, 0);
  gone.setPlacement({{"node-a", 0}, {"node-a", 1}});
  EXPECT_TRUE(gone.prepare({}).empty());
  EXPECT_EQ(gone.executionRank(fx.campaign->incidents()[0].faults[0].target), std::nullopt);
  // Without a placement it cannot be resolved, and the error names the fault.
  Session blind(fx.campaign, std::make_shared<MemoryStateStore>(), 0, 2, 0);
  EXPECT_NE(errorOf([&] { blind.prepare({}); }).find("incidents[0].faults[0].target.host \"node-b\""),
            std::string::npos)
      << errorOf([&] { blind.prepare({}); });
  EXPECT_NE(errorOf([&] { blind.setPlacement({{"a", 0}, {"a", 0}}); }).find("place of another rank"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { blind.setPlacement({}); }).find("must hold rank 0"), std::string::npos);
}

TEST(Session, UnselectedCandidatesAreRecordedAsSkipped) {
  Fixture fx{parse(manifest({{"iterations", 1}}, Json{{"at", {3}}, {"probability", 0.0}}))};
  auto s = fx.session();
  EXPECT_TRUE(s->arm(3).actions.empty());
  EXPECT_EQ(only(s->records()).status, RecordStatus::kSkippedProbability);
  EXPECT_EQ(fx.store->load()->attemptsAt("inc", 3), 0);  // nothing claimed
}

TEST(Session, OnlyThisRanksFaultsAreArmedButSafetyCountsEveryRank) {
  Json m = manifest({{"iterations", 1}});
  Json kill = {
      {"fault_id", "kill"}, {"type", "process_termination"}, {"target", {{"rank", 1}, {"surface", "process"}}}};
  m["incidents"][0]["faults"].push_back(kill);
  Fixture fx{parse(m)};
  const ExecutorInfo process{
      "process", {FailureType::kProcessTermination}, SafetyClass::kIsolatedDestructive, false, true, {}};
  auto rank0 = fx.session(0, 0, 2, {process});
  EXPECT_EQ(rank0->assignments().size(), 1u);
  const ArmPlan plan = rank0->arm(3);
  ASSERT_EQ(plan.actions.size(), 1u);
  EXPECT_EQ(plan.actions[0].fault, 0u);
  EXPECT_FALSE(plan.all_safe);  // rank 1's action is destructive: every rank knows

  Fixture f1{parse(m)};
  auto rank1 = f1.session(0, 1, 2, {process});
  ASSERT_EQ(rank1->assignments().size(), 1u);
  EXPECT_EQ(rank1->assignments()[0].executor, 0u);
  EXPECT_EQ(rank1->arm(3).actions.at(0).injection_id, "inc@3/kill");
}

TEST(Session, PrepareChecksRanksJournalAndExecutors) {
  const std::shared_ptr<Campaign> c = parse(manifest({{"iterations", 1}}, Json{{"at", {3}}}, 3));
  auto store = std::make_shared<MemoryStateStore>();
  Session outside(c, store, 0, 2, 0);
  EXPECT_EQ(errorOf([&] { outside.prepare({}); }),
            "incidents[0].faults[0].target.rank: 3 is outside the world of 2 ranks");

  // A journal of another campaign in the store is refused before anything is armed.
  const std::shared_ptr<Campaign> other = parse(manifest({{"iterations", 2}}));
  auto used = std::make_shared<MemoryStateStore>();
  ASSERT_TRUE(used->compareAndSwap(std::nullopt, Journal::fresh(*other)));
  Session stale(parse(manifest({{"iterations", 1}})), used, 0, std::nullopt, 0);
  EXPECT_NE(errorOf([&] { stale.prepare({}); }), "");

  Session unprepared(c, store, 0, std::nullopt, 0);
  EXPECT_NE(errorOf([&] { unprepared.start(); }), "");
}

TEST(Session, StoreChangedByAnotherWorkerIsAnError) {
  Fixture fx{parse(manifest({{"iterations", 1}}))};
  auto s = fx.session();
  // Another worker claims the candidate first.
  const Journal theirs = withAttempt(*fx.store->load(), "inc", 3, 1);
  ASSERT_TRUE(fx.store->compareAndSwap(fx.store->load(), theirs));
  EXPECT_EQ(errorOf([&] { s->arm(3); }), "the state store changed under inc@3; another worker owns this campaign");

  Fixture fy{parse(manifest({{"iterations", 1}}))};
  Session late(fy.campaign, fy.store, 0, std::nullopt, 0);
  late.prepare({});
  ASSERT_TRUE(fy.store->compareAndSwap(std::nullopt, Journal::fresh(*fy.campaign)));
  EXPECT_EQ(errorOf([&] { late.start(); }), "the state store changed while the campaign was being enabled");
}

TEST(Session, AgreementDigestDependsOnIterationAndJournal) {
  Fixture fx{parse(manifest({{"iterations", 1}}))};
  Session a(fx.campaign, fx.store, 0, std::nullopt, 0), b(fx.campaign, fx.store, 1, std::nullopt, 0),
      c(fx.campaign, fx.store, 0, std::nullopt, 1);
  a.prepare({});
  b.prepare({});
  c.prepare({});
  EXPECT_EQ(a.agreementDigest(), b.agreementDigest());  // the rank is not part of it
  EXPECT_NE(a.agreementDigest(), c.agreementDigest());
  a.start();
  Session d(fx.campaign, fx.store, 0, std::nullopt, 0);
  d.prepare({});
  EXPECT_NE(d.agreementDigest(), b.agreementDigest());  // a journal now exists
}

TEST(Session, ActivationOutcomes) {
  Fixture fx{parse(manifest({{"iterations", 3}}))};
  auto s = fx.session();
  const std::string id = s->arm(3).actions.at(0).injection_id;
  // Failed activation: does not stay armed; settling an armed record fails it.
  EXPECT_FALSE(s->activated(id, "builtin", false, Json::object(), "changed no element", false));
  s->settle(id, false, "changed no element", false, Json::object(), "changed no element", std::nullopt);
  EXPECT_EQ(only(s->records()).status, RecordStatus::kFailed);
  EXPECT_EQ(only(s->records()).error, "changed no element");
  // Unknown ids are errors, never silently ignored.
  EXPECT_NE(errorOf([&] { s->settle("nope", false, "", true, Json::object(), "", std::nullopt); }), "");
}

TEST(Session, NotYetVerifiedEffectStaysArmedUntilItsCallsAreUsed) {
  Fixture fx{parse(manifest({{"matching_calls", 1}}, Json{{"at", {3}}}, 0, "output"))};
  auto s = fx.session();
  const std::string id = s->arm(3).actions.at(0).injection_id;
  EXPECT_TRUE(s->activated(id, "builtin", false, Json::object(), "", false));  // a hook waits for its call
  EXPECT_EQ(s->expired(3), std::vector<std::string>{id});                      // matching_calls 1: one iteration
  s->settle(id, false, "", false, Json::object(), "no matching call happened", std::nullopt);
  EXPECT_EQ(only(s->records()).status, RecordStatus::kFailed);
  EXPECT_EQ(only(s->records()).error, "no matching call happened");
}

TEST(Session, RaisedAndAbandonedActivationsFail) {
  Json m = manifest({{"iterations", 1}});
  Json second = m["incidents"][0]["faults"][0];
  second["fault_id"] = "g";
  second["target"]["index"] = 1;
  m["incidents"][0]["faults"].push_back(second);
  Fixture fx{parse(m)};
  auto s = fx.session();
  const ArmPlan plan = s->arm(3);
  ASSERT_EQ(plan.actions.size(), 2u);
  s->activationRaised(plan.actions[0].injection_id, "builtin", Json::object(), "RuntimeError: boom");
  s->abandon(plan.actions[1].injection_id, "not activated: an earlier activation raised");
  const auto records = s->records();
  EXPECT_EQ(records[0].status, RecordStatus::kFailed);
  EXPECT_EQ(records[0].error, "RuntimeError: boom");
  EXPECT_EQ(records[1].status, RecordStatus::kFailed);
  EXPECT_EQ(records[1].error, "not activated: an earlier activation raised");
  s->abandon(plan.actions[0].injection_id, "ignored");  // terminal records stay as they are
  EXPECT_EQ(s->records()[0].error, "RuntimeError: boom");
}

TEST(Session, ReplacedStateFailsOnlyWhenItsWindowHadNotEnded) {
  Fixture fx{parse(manifest({{"iterations", 3}}))};
  auto s = fx.session();
  const std::string id = s->arm(3).actions.at(0).injection_id;
  ASSERT_TRUE(s->activated(id, "builtin", true, Json::object(), "", false));
  s->replaced(id, 4);  // the window runs through 5
  s->settle(id, false, "", true, Json::object(), "", Json{{"retired", "replaced by a checkpoint load"}});
  EXPECT_EQ(only(s->records()).status, RecordStatus::kFailed);
  EXPECT_EQ(only(s->records()).error, "its state was replaced by a checkpoint load before its lifetime ended");

  Fixture fy{parse(manifest({{"iterations", 3}}))};
  auto t = fy.session();
  const std::string jd = t->arm(3).actions.at(0).injection_id;
  ASSERT_TRUE(t->activated(jd, "builtin", true, Json::object(), "", false));
  t->replaced(jd, 5);  // at the end of its window: not early
  t->settle(jd, false, "", true, Json::object(), "", std::nullopt);
  EXPECT_EQ(only(t->records()).status, RecordStatus::kCompleted);
}

TEST(Session, UntilLifetimesEndByNotificationOrCampaignEnd) {
  for (const char* until : {"recovery", "replacement", "campaign_end"}) {
    Fixture fx{parse(manifest({{"until", until}}))};
    auto s = fx.session();
    const std::string id = s->arm(3).actions.at(0).injection_id;
    ASSERT_TRUE(s->activated(id, "builtin", true, Json::object(), "", false));
    EXPECT_TRUE(s->expired(1000000).empty()) << until;
    const Until u = *parseUntil(until);
    EXPECT_EQ(s->armedUntil(u), std::vector<std::string>{id});
    const auto closing = s->closing();
    ASSERT_EQ(closing.size(), 1u);
    EXPECT_EQ(closing[0].second, u != Until::kCampaignEnd) << until;  // only campaign_end completes at close
  }
  Fixture fx{parse(manifest({{"iterations", 5}}))};
  auto s = fx.session();
  const std::string id = s->arm(3).actions.at(0).injection_id;
  ASSERT_TRUE(s->activated(id, "builtin", true, Json::object(), "", false));
  EXPECT_TRUE(s->closing().at(0).second);  // a bounded window cut short is cancelled
  s->settle(id, true, "", true, Json::object(), "", std::nullopt);
  EXPECT_EQ(only(s->records()).status, RecordStatus::kCancelled);
}

TEST(Session, ObservesStaleStateOneBoundaryAheadWithCampaignStartOrigin) {
  Json m = manifest({{"iterations", 1}});
  m["incidents"][0]["faults"][0]["type"] = "stale_state";
  m["incidents"][0]["faults"][0]["parameters"] = Json::object();
  m["clock"] = {{"type", "training_iteration"}, {"origin", "campaign_start"}};
  Fixture fx{parse(m)};
  auto s = fx.session(10);  // resumed: manifest position 3 is iteration 13
  EXPECT_EQ(s->originOffset(), 10);
  EXPECT_TRUE(s->observe(10).empty());
  const std::vector<Action> observe = s->observe(11);  // history starts the boundary before 13 is armed
  ASSERT_EQ(observe.size(), 1u);
  EXPECT_EQ(observe[0].position, 3);
  EXPECT_EQ(observe[0].iteration, 13);
  EXPECT_EQ(observe[0].injection_id, "inc@3/f");
  EXPECT_EQ(s->nextDue(), 13);
  EXPECT_EQ(s->arm(13).actions.at(0).iteration, 13);
}

ExecutorInfo executor(const char* name, SafetyClass ceiling, bool one_shot = false, bool inline_done = false) {
  return {name, {FailureType::kTensorCorruption}, ceiling, one_shot, inline_done, {}};
}

TEST(Executors, EligibilityFollowsSafetyAndLifetime) {
  const Campaign c = Campaign::parse(manifest({{"iterations", 2}}).dump());
  const Incident& inc = c.incidents()[0];
  const Fault& fault = inc.faults[0];
  EXPECT_EQ(pickExecutor(inc, fault, {}, "w"), std::nullopt);  // the built-in executor
  EXPECT_EQ(pickExecutor(inc, fault, {executor("x", SafetyClass::kSafeInProcess)}, "w"), 0u);
  EXPECT_EQ(errorOf([&] { pickExecutor(inc, fault, {executor("x", SafetyClass::kSafeInProcess, true)}, "w"); }),
            "w: a persistent lifetime cannot use the one_shot executor 'x'");

  const Campaign calls = Campaign::parse(manifest({{"matching_calls", 2}}, Json{{"at", {3}}}, 0, "output").dump());
  EXPECT_EQ(errorOf([&] {
              pickExecutor(calls.incidents()[0], calls.incidents()[0].faults[0],
                           {executor("x", SafetyClass::kSafeInProcess)}, "w");
            }),
            "w: a matching_calls lifetime needs an executor declared completes_inline=True; 'x' is not");

  Json m = manifest({{"iterations", 1}});
  m["incidents"][0]["faults"][0] = {
      {"fault_id", "net"}, {"type", "network_partition"}, {"target", {{"surface", "collective"}}}};
  const Campaign net = Campaign::parse(m.dump());
  const Incident& ni = net.incidents()[0];
  EXPECT_EQ(errorOf([&] { pickExecutor(ni, ni.faults[0], {}, "w"); }),
            "w: no executor supports network_partition on surface 'collective' (configure one with executors=...)");
  ExecutorInfo low{"low", {FailureType::kNetworkPartition}, SafetyClass::kIsolatedDestructive, false, false, {}};
  EXPECT_EQ(errorOf([&] { pickExecutor(ni, ni.faults[0], {low}, "w"); }),
            "w: executor 'low' supports network_partition but its safety ceiling isolated_destructive is below "
            "cluster_destructive");
}

TEST(Executors, SurfacesLimitWhatAnExecutorTakes) {
  const Campaign c = Campaign::parse(manifest({{"iterations", 2}}).dump());  // tensor_corruption on output
  const Incident& inc = c.incidents()[0];
  ExecutorInfo elsewhere = executor("collective-only", SafetyClass::kClusterDestructive);
  elsewhere.supported_surfaces = {Surface::kCollective};
  ExecutorInfo here = executor("output-only", SafetyClass::kClusterDestructive);
  here.supported_surfaces = {Surface::kWeight, Surface::kOutput};
  // A surface the executor does not name goes on to the next executor, then to the built-in one.
  EXPECT_EQ(pickExecutor(inc, inc.faults[0], {elsewhere}, "w"), std::nullopt);
  EXPECT_EQ(pickExecutor(inc, inc.faults[0], {elsewhere, here}, "w"), 1u);
  EXPECT_EQ(pickExecutor(inc, inc.faults[0], {executor("any", SafetyClass::kSafeInProcess), here}, "w"), 0u);
}

TEST(Executors, ActivationResultsMustMatchTheLifetime) {
  Lifetime calls{LifetimeKind::kMatchingCalls, 1, Until::kCampaignEnd};
  Lifetime persistent{LifetimeKind::kIterations, 3, Until::kCampaignEnd};
  Lifetime one{LifetimeKind::kIterations, 1, Until::kCampaignEnd};
  EXPECT_EQ(activationProblem(one, true, true), "a one_shot executor returned an active effect");
  EXPECT_NE(activationProblem(calls, false, true), "");
  EXPECT_EQ(activationProblem(calls, false, false), "");
  EXPECT_NE(activationProblem(persistent, false, false), "");
  EXPECT_EQ(activationProblem(persistent, false, true), "");
  EXPECT_EQ(activationProblem(one, false, false), "");
  EXPECT_EQ(persistent.lastActiveIteration(7), 9);
  EXPECT_EQ(calls.lastActiveIteration(7), 7);
  EXPECT_EQ((Lifetime{LifetimeKind::kUntil, 1, Until::kRecovery}).lastActiveIteration(7), std::nullopt);
}

Fault faultWith(FailureType type, Json parameters) {
  Fault f;
  f.type = type;
  f.parameters = std::move(parameters);
  return f;
}

TEST(EffectSpecs, DefaultsAreAppliedOnce) {
  const EffectSpec flip = effectSpec(faultWith(FailureType::kTensorCorruption, Json::object()));
  EXPECT_EQ(flip.scope, inject::Scope::kSingle);
  EXPECT_EQ(flip.corruption.operation, inject::Operation::kSignFlip);
  EXPECT_EQ(flip.corruption.magnitude, inject::Magnitude::kMedium);
  EXPECT_FALSE(flip.corruption.value.has_value());

  const EffectSpec drop = effectSpec(faultWith(FailureType::kDrop, Json{{"scope", "row"}}));
  EXPECT_EQ(drop.scope, inject::Scope::kRow);
  EXPECT_EQ(drop.corruption.operation, inject::Operation::kSetValue);
  EXPECT_EQ(drop.corruption.value, 0.0);

  const EffectSpec nan = effectSpec(
      faultWith(FailureType::kTensorCorruption, Json{{"operation", "set_value"}, {"value", "-inf"}, {"scope", "10%"}}));
  EXPECT_EQ(nan.scope, inject::Scope::kTenPercent);
  ASSERT_TRUE(nan.corruption.value.has_value());
  EXPECT_TRUE(std::isinf(*nan.corruption.value) && *nan.corruption.value < 0);

  const EffectSpec scale = effectSpec(
      faultWith(FailureType::kTensorCorruption, Json{{"operation", "scale"}, {"factor", 4}, {"magnitude", "large"}}));
  EXPECT_EQ(scale.corruption.factor, 4.0);
  EXPECT_EQ(scale.corruption.magnitude, inject::Magnitude::kLarge);

  EXPECT_EQ(effectSpec(faultWith(FailureType::kDelay, Json{{"delay_ms", 25.5}})).delay_ms, 25.5);
  const EffectSpec state = effectSpec(faultWith(FailureType::kStaleState, Json{{"state_key", "exp_avg"}}));
  EXPECT_EQ(state.state_key, "exp_avg");
}

}  // namespace
}  // namespace lmr::campaign
