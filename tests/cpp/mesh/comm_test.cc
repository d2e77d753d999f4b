// Communication stragglers on an 8-rank 2-D mesh (rows of 4, columns of 2; two ranks per
// pretend host): a slow link named with its host after confirmation, a slow whole group
// without a culprit, a late computing rank kept apart from a slow link, contradictions,
// noise, malformed rounds and resource maps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/mesh/comm.h"

namespace lmr::mesh {
namespace {

struct Group {
  std::string id;
  std::vector<std::int64_t> members;
};

const std::vector<Group> kMesh = {{"row0", {0, 1, 2, 3}}, {"row1", {4, 5, 6, 7}}, {"col0", {0, 4}},
                                  {"col1", {1, 5}},       {"col2", {2, 6}},       {"col3", {3, 7}}};

ResourceMap hosts() { return ResourceMap::fromHosts({"h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"}); }

// One round: every group all-reduces 1 MiB; transfers take 10 ms (plus jitter), slower by
// `slow_s` in groups holding `slow_rank` (a slow link) and by `group_s` in `slow_group`;
// `late_rank` arrives `late_s` after its peers.
struct Round {
  std::int64_t slow_rank = -1;
  double slow_s = 0.02;
  std::string slow_group;
  double group_s = 0.02;
  std::int64_t late_rank = -1;
  double late_s = 0.05;
  int jitter = 0;
};

Round link(std::int64_t rank, int jitter) {
  Round r;
  r.slow_rank = rank;
  r.jitter = jitter;
  return r;
}

Round slowGroup(const std::string& group, int jitter) {
  Round r;
  r.slow_group = group;
  r.jitter = jitter;
  return r;
}

Round late(std::int64_t rank, int jitter) {
  Round r;
  r.late_rank = rank;
  r.jitter = jitter;
  return r;
}

Round quiet(int jitter) { return slowGroup("", jitter); }

std::vector<CollectiveObservation> round(const Round& r, const std::vector<Group>& groups = kMesh) {
  std::vector<CollectiveObservation> out;
  int k = 0;
  for (const Group& g : groups) {
    CollectiveObservation o{g.id, g.members, "all_reduce", 1 << 20, {}, {}};
    bool holds_slow = false, holds_late = false;
    for (std::int64_t m : g.members) {
      holds_slow = holds_slow || m == r.slow_rank;
      holds_late = holds_late || m == r.late_rank;
    }
    double transfer = 0.010 + 0.0002 * ((k++ * 7 + r.jitter) % 5);
    if (holds_slow) transfer += r.slow_s;
    if (g.id == r.slow_group) transfer += r.group_s;
    for (std::int64_t m : g.members) {
      o.transfer.push_back(transfer);
      o.wait.push_back(holds_late && m != r.late_rank ? r.late_s : 0.0001);
    }
    out.push_back(o);
  }
  return out;
}

TEST(CommStragglers, ASlowLinkNamesTheRankAndItsHostAfterConfirmation) {
  CommTracker t;
  const ResourceMap map = hosts();
  for (int step = 1; step <= 2; ++step) {
    const CommVerdict v = t.observe(step, round(link(5, step)), &map);
    EXPECT_EQ(v.candidate_groups, (std::vector<std::string>{"col1", "row1"}));
    EXPECT_TRUE(v.slow_groups.empty());  // not confirmed yet
    EXPECT_FALSE(v.rank);
  }
  const CommVerdict v = t.observe(3, round(link(5, 3)), &map);
  EXPECT_EQ(v.slow_groups, (std::vector<std::string>{"col1", "row1"}));
  ASSERT_TRUE(v.rank);
  EXPECT_EQ(*v.rank, 5);
  ASSERT_TRUE(v.resources);
  EXPECT_EQ(v.resources->host, "h2");
  EXPECT_TRUE(v.late_ranks.empty());
}

TEST(CommStragglers, ASlowWholeGroupHasNoCulprit) {
  CommTracker t;
  CommVerdict v;
  for (int step = 1; step <= 3; ++step) v = t.observe(step, round(slowGroup("row1", step)));
  EXPECT_EQ(v.slow_groups, std::vector<std::string>{"row1"});
  EXPECT_FALSE(v.rank);
  EXPECT_NE(v.reason.find("one slow group"), std::string::npos);
}

TEST(CommStragglers, ALateComputingRankIsNotASlowLink) {
  CommTracker t;
  CommVerdict v;
  for (int step = 1; step <= 5; ++step) v = t.observe(step, round(late(5, step)));
  EXPECT_TRUE(v.slow_groups.empty());
  EXPECT_TRUE(v.candidate_groups.empty());
  EXPECT_EQ(v.late_ranks, std::vector<std::int64_t>{5});  // its row waited for it
  EXPECT_FALSE(v.rank);
}

// What a 4-rank DDP world on a busy 2-core host recorded (bucket all-reduce waits, ms): rank 2
// computed 80 ms longer, and rank 3 happened to arrive 30 ms before ranks 0 and 1. An early
// arrival makes nobody wait; it must not widen the spread that rank 2 is measured against.
TEST(CommStragglers, AnEarlyArrivalDoesNotHideALateOne) {
  const std::vector<std::vector<double>> rounds = {
      {0.0633, 0.0628, 0.0007, 0.0935}, {0.0500, 0.0742, 0.0072, 0.0471}, {0.0652, 0.0972, 0.0012, 0.0743}};
  CommTracker t;
  int step = 0;
  for (const std::vector<double>& wait : rounds) {
    CollectiveObservation o{"world", {0, 1, 2, 3}, "ddp_bucket", 1 << 20, wait, {0.001, 0.001, 0.001, 0.001}};
    const CommVerdict v = t.observe(++step, {o});
    EXPECT_EQ(v.late_ranks, std::vector<std::int64_t>{2}) << "round " << step;
  }
  // Spread arrivals with nobody well behind the majority: nobody is late; one 25 ms behind
  // a tight majority is.
  CollectiveObservation spread{"world", {0, 1, 2, 3}, "ddp_bucket", 1 << 20, {0.030, 0.021, 0.012, 0.0}, {}};
  spread.transfer.assign(4, 0.001);
  EXPECT_TRUE(t.observe(++step, {spread}).late_ranks.empty());
  CollectiveObservation behind{"world", {0, 1, 2, 3}, "ddp_bucket", 1 << 20, {0.026, 0.025, 0.025, 0.0}, {}};
  behind.transfer.assign(4, 0.001);
  EXPECT_EQ(t.observe(++step, {behind}).late_ranks, std::vector<std::int64_t>{3});
  // Two of four late (a pipelined check's rank 0 held back 220 ms beside rank 2's 300 ms):
  // no strict minority, nobody named.
  CollectiveObservation two{"world", {0, 1, 2, 3}, "ddp_bucket", 1 << 20, {0.0818, 0.2942, 0.0011, 0.3120}, {}};
  two.transfer.assign(4, 0.001);
  EXPECT_TRUE(t.observe(++step, {two}).late_ranks.empty());
}

TEST(CommStragglers, AHealthyGroupHoldingTheSharedRankContradicts) {
  std::vector<Group> groups = kMesh;
  groups.push_back({"pair", {5, 6}});  // holds rank 5, stays fast
  CommTracker t;
  CommVerdict v;
  for (int step = 1; step <= 3; ++step) {
    auto r = round(quiet(step), groups);
    for (auto& o : r)
      if (o.group == "row1" || o.group == "col1")
        for (double& x : o.transfer) x += 0.02;
    v = t.observe(step, r);
  }
  EXPECT_EQ(v.slow_groups, (std::vector<std::string>{"col1", "row1"}));
  EXPECT_FALSE(v.rank);
  EXPECT_NE(v.reason.find("group pair"), std::string::npos);
}

TEST(CommStragglers, SlowGroupsThatShareNoRankNameNobody) {
  CommTracker t;
  CommVerdict v;
  for (int step = 1; step <= 3; ++step) {
    auto r = round(quiet(step));
    for (auto& o : r)
      if (o.group == "col1" || o.group == "col2")
        for (double& x : o.transfer) x += 0.02;
    v = t.observe(step, r);
  }
  EXPECT_EQ(v.slow_groups, (std::vector<std::string>{"col1", "col2"}));
  EXPECT_FALSE(v.rank);
  EXPECT_EQ(v.reason, "the slow groups share no rank");
}

TEST(CommStragglers, NoiseAloneNamesNothing) {
  CommTracker t;
  for (int step = 1; step <= 50; ++step) {
    // One group slow in one round of every five: never three of the last five.
    const CommVerdict v = t.observe(step, round(slowGroup(step % 5 == 0 ? "col2" : "", step)));
    EXPECT_TRUE(v.slow_groups.empty()) << step;
    EXPECT_FALSE(v.rank);
  }
}

TEST(CommStragglers, GroupsOfOtherCollectivesOrSizesAreNotCompared) {
  EXPECT_EQ(sizeClass(0), 0);
  EXPECT_EQ(sizeClass(1), 0);
  EXPECT_EQ(sizeClass(1024), 10);
  EXPECT_EQ(sizeClass(2047), 10);
  CommTracker t;
  auto r = round(slowGroup("row1", 0));
  r[1].collective = "reduce_scatter";  // row1 alone in its class: nothing to compare with
  CommVerdict v;
  for (int step = 1; step <= 3; ++step) v = t.observe(step, r);
  EXPECT_TRUE(v.slow_groups.empty());
  EXPECT_TRUE(v.candidate_groups.empty());
}

TEST(CommStragglers, MalformedRoundsAreRejectedAndChangeNothing) {
  CommTracker t;
  auto r = round(quiet(0));
  r[0].wait.pop_back();
  EXPECT_THROW(t.observe(1, r), InvalidArgument);
  r = round(quiet(0));
  r[2].transfer[0] = -1.0;
  EXPECT_THROW(t.observe(1, r), InvalidArgument);
  r = round(quiet(0));
  r[3].members = {1, 1};
  EXPECT_THROW(t.observe(1, r), InvalidArgument);
  t.observe(1, round(quiet(0)));
  r = round(quiet(0));
  r[2].members = {0, 5};  // col0 seen before as {0, 4}
  EXPECT_THROW(t.observe(2, r), InvalidArgument);
  const ResourceMap small = ResourceMap::fromHosts({"h0", "h0"});
  EXPECT_THROW(t.observe(2, round(quiet(0)), &small), InvalidArgument);
}

// HSDP on 8 ranks, 4 replicas x 2 shards: four shard groups all-gather, two replicate
// groups all-reduce. The replicate class has two groups: they are compared as a pair.
std::vector<CollectiveObservation> hsdp(std::int64_t slow_rank, int jitter, double slow_s = 0.02) {
  std::vector<CollectiveObservation> out;
  int k = 0;
  const auto add = [&](const std::string& id, std::vector<std::int64_t> members, const std::string& what,
                       std::uint64_t bytes) {
    double transfer = 0.010 + 0.0002 * ((k++ * 7 + jitter) % 5);
    for (std::int64_t m : members)
      if (m == slow_rank) transfer += slow_s;
    CollectiveObservation o{id,
                            members,
                            what,
                            bytes,
                            std::vector<double>(members.size(), 0.0001),
                            std::vector<double>(members.size(), transfer)};
    out.push_back(o);
  };
  for (std::int64_t i = 0; i < 4; ++i) add("shard" + std::to_string(i), {2 * i, 2 * i + 1}, "all_gather", 1 << 18);
  for (std::int64_t j = 0; j < 2; ++j)
    add("replicate" + std::to_string(j), {j, j + 2, j + 4, j + 6}, "all_reduce", 1 << 19);
  return out;
}

TEST(CommStragglers, APairOfGroupsNarrowsAFourByTwoMeshToOneRank) {
  CommTracker t;
  const ResourceMap map = hosts();
  CommVerdict v;
  for (int step = 1; step <= 3; ++step) v = t.observe(step, hsdp(5, step), &map);
  EXPECT_EQ(v.slow_groups, (std::vector<std::string>{"replicate1", "shard2"}));
  ASSERT_TRUE(v.rank);
  EXPECT_EQ(*v.rank, 5);
  EXPECT_EQ(v.resources->host, "h2");
}

TEST(CommStragglers, APairWithinTheThresholdsOrWithThePairRuleOffGivesNoEvidence) {
  CommTracker quiet_pair;
  for (int step = 1; step <= 5; ++step) {
    const CommVerdict v = quiet_pair.observe(step, hsdp(-1, step));
    EXPECT_TRUE(v.candidate_groups.empty()) << step;
  }
  CommTracker small;  // 4 ms slower: over 1 ms but under half of the pair's 10 ms
  CommVerdict v;
  for (int step = 1; step <= 3; ++step) v = small.observe(step, hsdp(5, step, 0.004));
  EXPECT_EQ(v.slow_groups, std::vector<std::string>{"shard2"});  // four shard groups: consensus
  CommOptions off;
  off.pair_relative_threshold = 0;
  CommTracker without(off);
  for (int step = 1; step <= 3; ++step) v = without.observe(step, hsdp(5, step));
  EXPECT_EQ(v.slow_groups, std::vector<std::string>{"shard2"});
  EXPECT_FALSE(v.rank);  // shard2 holds ranks 4 and 5: one slow group does not say which
}

TEST(CommStragglers, AGroupObservedSeveralTimesInARoundCountsWithItsMedian) {
  CommTracker t;
  CommVerdict v;
  for (int step = 1; step <= 4; ++step) {
    auto r = round(quiet(step));
    auto once_slow = r[2];  // col0 again, once very slow: one of three observations
    for (double& x : once_slow.transfer) x += 0.5;
    const auto again = r[2];
    r.insert(r.begin(), once_slow);  // first in the round
    r.push_back(again);
    v = t.observe(step, r);
    EXPECT_TRUE(v.candidate_groups.empty()) << step;
  }
}

TEST(CommStragglers, AGroupSlowInOneSizeClassAndNotInAnotherIsSlow) {
  // A rate-limited link slows large transfers; small ones fit its burst and are not slow.
  CommTracker t;
  CommVerdict v;
  for (int step = 1; step <= 3; ++step) {
    auto r = hsdp(5, step);
    for (auto small : hsdp(-1, step)) {
      small.bytes = 64;
      r.push_back(small);
    }
    v = t.observe(step, r);
  }
  EXPECT_EQ(v.slow_groups, (std::vector<std::string>{"replicate1", "shard2"}));
  ASSERT_TRUE(v.rank) << v.reason;
  EXPECT_EQ(*v.rank, 5);
}

TEST(CommStragglers, AFabricFindingNarrowsTheNamedRankToItsNicOrSwitch) {
  const ResourceMap map = ResourceMap::fromJson(
      R"({"version": 1, "ranks": {"0": {"host": "h0", "nic": "mlx5_0", "switch": "leaf-a"},
          "1": {"host": "h0", "nic": "mlx5_1", "switch": "leaf-a"}, "2": {"host": "h1", "nic": "mlx5_0", "switch": "leaf-a"},
          "3": {"host": "h1", "nic": "mlx5_1", "switch": "leaf-a"}, "4": {"host": "h2", "nic": "mlx5_0", "switch": "leaf-b"},
          "5": {"host": "h2", "nic": "mlx5_1", "switch": "leaf-b"}, "6": {"host": "h3", "nic": "mlx5_0", "switch": "leaf-b"},
          "7": {"host": "h3", "nic": "mlx5_1", "switch": "leaf-b"}}})",
      8);
  const auto named = [&](const std::vector<FabricFinding>& fabric) {
    CommTracker t;
    CommVerdict v;
    for (int step = 1; step <= 3; ++step) v = t.observe(step, hsdp(5, step), &map, fabric);
    EXPECT_EQ(v.rank, std::optional<std::int64_t>(5));
    return v.fabric;
  };
  // Its NIC, reported by the other rank of its host: the NIC.
  const FabricFinding nic{4, "nic", "mlx5_1", "symbol_error +12"};
  EXPECT_EQ(named({nic}), std::optional<FabricFinding>(nic));
  // The same NIC name on another host is another NIC.
  EXPECT_FALSE(named({FabricFinding{6, "nic", "mlx5_1", "x"}}));
  // Its switch: the switch (a NIC finding wins over it).
  const FabricFinding leaf{0, "switch", "leaf-b", "port 17 flapping"};
  EXPECT_EQ(named({leaf}), std::optional<FabricFinding>(leaf));
  EXPECT_EQ(named({leaf, nic}), std::optional<FabricFinding>(nic));
  EXPECT_FALSE(named({FabricFinding{0, "switch", "leaf-a", "x"}}));
  // Malformed findings change nothing and are refused.
  CommTracker t;
  EXPECT_THROW(t.observe(1, hsdp(5, 1), &map, {FabricFinding{0, "cable", "c1", ""}}), InvalidArgument);
  EXPECT_THROW(t.observe(1, hsdp(5, 1), &map, {FabricFinding{9, "nic", "mlx5_0", ""}}), InvalidArgument);
  EXPECT_THROW(t.observe(1, hsdp(5, 1), &map, {FabricFinding{0, "nic", "", ""}}), InvalidArgument);
  EXPECT_THROW(t.observe(1, hsdp(5, 1), nullptr, {nic}), InvalidArgument);
}

TEST(CommStragglers, WithNoRankNamedTheOneDegradedSwitchEverySlowGroupReachesIsReported) {
  // Rows of four behind two leaf switches; row1 (ranks 4-7, behind leaf-b) is slow as a whole.
  std::string text = R"({"version": 1, "ranks": {)";
  for (int r = 0; r < 8; ++r)
    text += (r ? ", " : "") + std::string("\"") + std::to_string(r) + R"(": {"host": "h)" + std::to_string(r / 2) +
            R"(", "switch": "leaf-)" + (r < 4 ? "a" : "b") + "\"}";
  const ResourceMap map = ResourceMap::fromJson(text + "}}", 8);
  const auto run = [&](const std::vector<FabricFinding>& fabric) {
    CommTracker t;
    CommVerdict v;
    for (int step = 1; step <= 3; ++step) v = t.observe(step, round(slowGroup("row1", step)), &map, fabric);
    EXPECT_FALSE(v.rank);
    EXPECT_EQ(v.slow_groups, std::vector<std::string>{"row1"});
    return v;
  };
  const FabricFinding leaf{1, "switch", "leaf-b", "port 3 errors"};
  CommVerdict v = run({leaf});
  EXPECT_EQ(v.fabric, std::optional<FabricFinding>(leaf));
  EXPECT_NE(v.reason.find("switch leaf-b"), std::string::npos);
  EXPECT_FALSE(run({FabricFinding{1, "switch", "leaf-a", ""}}).fabric);  // row1 does not reach it
  EXPECT_FALSE(run({}).fabric);
  EXPECT_FALSE(run({FabricFinding{4, "nic", "mlx5_0", ""}}).fabric);  // a NIC names no switch
}

TEST(CommStragglers, CompleteObservationsComeFromCallsEveryMemberRecorded) {
  const auto rec = [](std::string group, std::vector<std::int64_t> members, std::int64_t call, std::uint64_t bytes,
                      double wait, double transfer) {
    return CollectiveRecord{std::move(group), std::move(members), call, "all_gather", bytes, wait, transfer};
  };
  std::vector<std::vector<CollectiveRecord>> by_rank(3);
  by_rank[0] = {rec("g01", {0, 1}, 1, 64, 0.1, 1.0), rec("g01", {0, 1}, 2, 64, 0.0, 2.0),
                rec("g02", {0, 2}, 1, 8, 0.0, 3.0)};
  by_rank[1] = {rec("g01", {0, 1}, 1, 128, 0.2, 1.5), rec("g01", {0, 1}, 3, 64, 0.0, 9.0)};
  by_rank[2] = {rec("g02", {0, 2}, 1, 8, 0.3, 3.5), rec("g21", {2, 1}, 1, 8, 0.0, 4.0)};
  const auto out = completeObservations(by_rank);
  ASSERT_EQ(out.size(), 2u);  // g01 call 1 and g02 call 1; the rest miss a member
  EXPECT_EQ(out[0].group, "g01");
  EXPECT_EQ(out[0].bytes, 128u);  // the most any member saw
  EXPECT_EQ(out[0].wait, (std::vector<double>{0.1, 0.2}));
  EXPECT_EQ(out[0].transfer, (std::vector<double>{1.0, 1.5}));
  EXPECT_EQ(out[1].group, "g02");
  EXPECT_EQ(out[1].transfer, (std::vector<double>{3.0, 3.5}));
  // A member that recorded the call with other members or another collective: left out.
  by_rank[2][0].collective = "all_reduce";
  EXPECT_EQ(completeObservations(by_rank).size(), 1u);
  by_rank[2][0].collective = "all_gather";
  by_rank[2][0].members = {2, 0};
  EXPECT_EQ(completeObservations(by_rank).size(), 1u);
  EXPECT_TRUE(completeObservations({}).empty());
}

TEST(CommStragglers, KeyedRecordsTakeTheirGroupFromTheTable) {
  const auto rec = [](std::string key, std::int64_t call, double transfer) {
    return CollectiveRecord{std::move(key), {}, call, "all_reduce", 64, 0.0, transfer};
  };
  std::vector<std::vector<CollectiveRecord>> by_rank(3);
  by_rank[0] = {rec("k1", 1, 1.0), rec("k9", 1, 5.0)};
  by_rank[1] = {rec("k1", 1, 1.5), rec("k9", 1, 5.5)};
  by_rank[2] = {rec("k2", 1, 2.0)};
  const GroupTable groups{{"k1", GroupEntry{"ranks:0,1", {0, 1}}}, {"k2", GroupEntry{"ranks:2", {2}}}};
  const auto out = completeObservations(by_rank, groups);
  ASSERT_EQ(out.size(), 2u);  // k9 is in no table entry (its leader's entry never came): left out
  EXPECT_EQ(out[0].group, "ranks:0,1");
  EXPECT_EQ(out[0].members, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(out[0].transfer, (std::vector<double>{1.0, 1.5}));
  EXPECT_EQ(out[1].group, "ranks:2");
  // Without the table nothing keyed is complete; a record with its own members mixes in.
  EXPECT_TRUE(completeObservations(by_rank).empty());
  by_rank[2].push_back(CollectiveRecord{"ranks:2", {2}, 7, "broadcast", 8, 0.0, 3.0});
  ASSERT_EQ(completeObservations(by_rank, groups).size(), 3u);
  // The tracker sees the table's names: a slow keyed group is reported by its id.
  CommTracker t(CommOptions{.confirmation_rounds = 1, .confirmation_checks = 1});
  std::vector<std::vector<CollectiveRecord>> round(8);
  GroupTable pairs;
  for (std::int64_t g = 0; g < 4; ++g) {
    const std::string key = "p" + std::to_string(g);
    pairs[key] = GroupEntry{"ranks:" + std::to_string(2 * g) + "," + std::to_string(2 * g + 1), {2 * g, 2 * g + 1}};
    for (std::int64_t m : {2 * g, 2 * g + 1})
      round[static_cast<std::size_t>(m)].push_back(rec(key, 1, g == 2 ? 0.5 : 0.01));
  }
  const CommVerdict v = t.observe(1, completeObservations(round, pairs));
  EXPECT_EQ(v.observations, 4u);
  EXPECT_EQ(v.candidate_groups, (std::vector<std::string>{"ranks:4,5"}));
}

TEST(CommStragglers, SizedRecordsTakeTheirMembersFromWhoReported) {
  const auto rec = [](std::string key, std::int64_t call, double transfer, std::int64_t size) {
    return CollectiveRecord{std::move(key), {}, call, "all_reduce", 64, 0.0, transfer, size};
  };
  std::vector<std::vector<CollectiveRecord>> by_rank(4);
  by_rank[0] = {rec("a", 1, 1.0, 3), rec("a", 2, 9.0, 3), rec("b", 1, 4.0, 2)};
  by_rank[2] = {rec("a", 1, 1.2, 3), rec("a", 2, 9.0, 3)};
  by_rank[3] = {rec("a", 1, 1.1, 3), rec("b", 1, 4.0, 3)};
  const auto out = completeObservations(by_rank);
  // a/1: all three of its members; a/2: rank 3 never recorded it (left out); b/1: two ranks
  // disagree on its size (left out).
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].group, "ranks:0,2,3");
  EXPECT_EQ(out[0].members, (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_EQ(out[0].transfer, (std::vector<double>{1.0, 1.2, 1.1}));
  // A table entry for the key wins over the size; a record naming its members is another
  // group even under the same key.
  const GroupTable table{{"a", GroupEntry{"dp", {0, 2, 3}}}};
  EXPECT_EQ(completeObservations(by_rank, table)[0].group, "dp");
  by_rank[1] = {CollectiveRecord{"a", {0, 1, 2, 3}, 1, "all_reduce", 64, 0.0, 1.0}};
  EXPECT_TRUE(completeObservations(by_rank).empty());
  // The tracker names a slow sized group by its members, and the rank two slow groups share.
  CommTracker t(CommOptions{.confirmation_rounds = 1, .confirmation_checks = 1});
  std::vector<std::vector<CollectiveRecord>> round(9);
  for (std::int64_t g = 0; g < 3; ++g)
    for (std::int64_t i = 0; i < 3; ++i) {
      const std::int64_t row = 3 * g + i, column = 3 * i + g;  // rows {0,1,2}, ...; columns {0,3,6}, ...
      round[static_cast<std::size_t>(row)].push_back(rec("row" + std::to_string(g), 1, g == 1 ? 0.5 : 0.01, 3));
      round[static_cast<std::size_t>(column)].push_back(rec("col" + std::to_string(g), 1, g == 2 ? 0.5 : 0.01, 3));
    }
  const CommVerdict v = t.observe(1, completeObservations(round));
  EXPECT_EQ(v.observations, 6u);
  EXPECT_EQ(v.slow_groups, (std::vector<std::string>{"ranks:2,5,8", "ranks:3,4,5"}));
  ASSERT_TRUE(v.rank.has_value());
  EXPECT_EQ(*v.rank, 5);
}

TEST(CommStragglers, ADecidedCheckNeedsABitmapEntryPerPeer) {
  replay::StragglerTracker t(replay::StragglerOptions{});
  consensus::TimingResult check;
  check.status = consensus::Status::kAttributed;
  check.peer_ranks = {0, 1};
  check.bitmap = {true};
  EXPECT_THROW(t.confirm("pair", 1, check), InvalidArgument);
}

TEST(ResourceMaps, ParseStrictlyWithThePathOfWhatIsWrong) {
  const ResourceMap m = ResourceMap::fromJson(
      R"({"version": 1, "ranks": {"0": {"host": "a", "nic": "mlx5_0", "switch": "leaf-1"}, "1": {"host": "b"}}})", 2);
  EXPECT_EQ(m.of(0), (Resources{"a", "mlx5_0", "leaf-1"}));
  EXPECT_EQ(m.of(1).host, "b");
  EXPECT_THROW(m.of(2), InvalidArgument);
  const auto error = [](const std::string& text, std::int64_t world) {
    try {
      ResourceMap::fromJson(text, world);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"version": 1, "ranks": {"0": {"host": "a"}}})", 2).find("ranks: rank 1 is missing"),
            std::string::npos);
  EXPECT_NE(error(R"({"version": 1, "ranks": {"0": {"host": "a", "rack": "r"}}})", 1).find("ranks.0"),
            std::string::npos);
  EXPECT_NE(error(R"({"version": 1, "ranks": {"x": {"host": "a"}}})", 1).find("ranks.x"), std::string::npos);
  EXPECT_NE(error(R"({"version": 1, "ranks": {"01": {"host": "a"}}})", 2).find("leading zeros"), std::string::npos);
  EXPECT_NE(error(R"({"version": 1, "ranks": {"3": {"host": "a"}}})", 2).find("outside the world"), std::string::npos);
  EXPECT_NE(error(R"({"version": 2, "ranks": {}})", 1).find("version"), std::string::npos);
  EXPECT_NE(error(R"({"version": 1, "ranks": {"0": {"host": ""}}})", 1).find("ranks.0.host"), std::string::npos);
  EXPECT_NE(error(R"({"version": 1, "ranks": {"0": {"host": "a"}}, "extra": 1})", 1).find("extra"), std::string::npos);
  EXPECT_NE(error("[1, 2", 1), "no error");
  EXPECT_THROW(ResourceMap::fromHosts({}), InvalidArgument);
  EXPECT_THROW(ResourceMap::fromHosts({"a", ""}), InvalidArgument);
}

}  // namespace
}  // namespace lmr::mesh
