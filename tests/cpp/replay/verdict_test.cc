// The check verdict, decided on every peer from the same gathered votes: peers run as
// threads, each with its own straggler tracker, over the layouts of DDP (one state group),
// pure FSDP (shard peers compare materialized state: one group) and HSDP (two replicas of
// each shard), 2 to 16 peers.
#include <gtest/gtest.h>

#include <barrier>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/replay/verdict.h"

namespace lmr::replay {
namespace {

using consensus::Status;

enum class Shape { kDdp, kFsdp, kHsdp };

PeerLayout layoutOf(Shape shape, int n) {
  PeerLayout l;
  for (int r = 0; r < n; ++r) l.ranks.push_back(r);
  if (shape == Shape::kHsdp) {  // dp_replicate = 2: rank r and r + n/2 hold the same shard
    for (int s = 0; s < n / 2; ++s) l.state_groups.push_back({s, s + n / 2});
  } else {
    l.state_groups.push_back(l.ranks);
  }
  return l;
}

// Every peer builds its own vote, the votes are exchanged, every peer decides.
std::vector<CheckVerdict> asPeers(const PeerLayout& layout, const std::vector<std::string>& checked,
                                  const std::function<CheckVote(std::size_t)>& vote_of, int checks = 1) {
  const std::size_t n = layout.ranks.size();
  std::vector<CheckVote> gathered(n);
  std::vector<CheckVerdict> out(n);
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      StragglerTracker tracker(StragglerOptions{});
      for (int c = 1; c <= checks; ++c) {
        gathered[i] = vote_of(i);
        sync.arrive_and_wait();
        out[i] = decideCheck(layout, c, checked, {}, gathered, tracker);
        sync.arrive_and_wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

CheckVote healthy() {
  CheckVote v;
  for (const char* s :
       {"hidden.1.invocation", "hidden.1.params", "hidden.1.output", "optimizer.0.state", "optimizer.0.update"})
    v.surfaces[s] = std::string(16, 'a');
  v.repetitions["hidden.1"] = {0.010, 0.011, 0.010};
  v.repetitions["optimizer.0"] = {0.002};
  return v;
}

const std::vector<std::string> kChecked = {"hidden.1", "optimizer.0"};

void expectSameEverywhere(const std::vector<CheckVerdict>& all) {
  for (const CheckVerdict& v : all) {
    EXPECT_EQ(v.status, all[0].status);
    EXPECT_EQ(v.sdc_bitmap, all[0].sdc_bitmap);
    EXPECT_EQ(v.sdc_sources, all[0].sdc_sources);
    EXPECT_EQ(v.inconclusive, all[0].inconclusive);
    EXPECT_EQ(v.reasons, all[0].reasons);
    EXPECT_EQ(v.straggler_bitmap, all[0].straggler_bitmap);
  }
}

class Verdict : public ::testing::TestWithParam<std::tuple<Shape, int>> {};

TEST_P(Verdict, HealthyPeersAgree) {
  const auto [shape, n] = GetParam();
  const auto all = asPeers(layoutOf(shape, n), kChecked, [](std::size_t) { return healthy(); });
  expectSameEverywhere(all);
  EXPECT_EQ(all[0].status, Status::kAgree);
  EXPECT_TRUE(all[0].inconclusive.empty());
  EXPECT_EQ(all[0].surfaces.size(), 5u);
}

TEST_P(Verdict, ComputeCorruptionIsAttributedWithAMajority) {
  const auto [shape, n] = GetParam();
  const std::size_t bad = static_cast<std::size_t>(n) - 1;
  const auto all = asPeers(layoutOf(shape, n), kChecked, [bad](std::size_t i) {
    CheckVote v = healthy();
    if (i == bad) v.surfaces["hidden.1.output"] = std::string(16, 'x');
    return v;
  });
  expectSameEverywhere(all);
  const CheckVerdict& v = all[0];
  if (n >= 3) {
    EXPECT_EQ(v.status, Status::kAttributed);
    EXPECT_EQ(v.sdc_sources, std::vector<std::string>{"hidden.1.output"});
    for (std::size_t i = 0; i < v.sdc_bitmap.size(); ++i) EXPECT_EQ(v.sdc_bitmap[i], i == bad);
  } else {  // two peers can see the mismatch, never name anyone
    EXPECT_EQ(v.status, Status::kInconclusive);
    EXPECT_TRUE(v.sdc_sources.empty());
    EXPECT_EQ(v.reasons.at("hidden.1.output").rfind("no_majority:", 0), 0u);
  }
}

TEST_P(Verdict, StateCorruptionIsNeverMisattributedWithoutAMajorityOfCopies) {
  const auto [shape, n] = GetParam();
  const auto all = asPeers(layoutOf(shape, n), kChecked, [](std::size_t i) {
    CheckVote v = healthy();
    if (i == 0) v.surfaces["optimizer.0.state"] = std::string(16, 'x');
    return v;
  });
  expectSameEverywhere(all);
  const CheckVerdict& v = all[0];
  if (shape != Shape::kHsdp && n >= 3) {
    EXPECT_EQ(v.status, Status::kAttributed);
    EXPECT_EQ(v.sdc_sources, std::vector<std::string>{"optimizer.0.state"});
    EXPECT_TRUE(v.sdc_bitmap[0]);
  } else {  // HSDP: two copies of each shard; or two peers in all
    EXPECT_EQ(v.status, Status::kInconclusive);
    EXPECT_TRUE(v.sdc_sources.empty());
    EXPECT_TRUE(v.surfaces.at("optimizer.0.state").split);
  }
  EXPECT_EQ(v.surfaces.at("hidden.1.output").status, Status::kAgree);
}

TEST_P(Verdict, AnErrorOnOnePeerMakesTheRecipeInconclusiveEverywhere) {
  const auto [shape, n] = GetParam();
  const auto all = asPeers(layoutOf(shape, n), kChecked, [](std::size_t i) {
    CheckVote v = healthy();
    if (i == 1) {
      v.errors["hidden.1"] = "RuntimeError: boom";
      v.surfaces["hidden.1.output"] = std::string(16, 'x');  // whatever it left behind is dropped
    }
    return v;
  });
  expectSameEverywhere(all);
  const CheckVerdict& v = all[0];
  EXPECT_EQ(v.status, Status::kInconclusive);
  EXPECT_EQ(v.inconclusive, std::vector<std::string>{"hidden.1"});
  EXPECT_EQ(v.reasons.at("hidden.1"), "replay_error: RuntimeError: boom (rank 1)");
  EXPECT_FALSE(v.surfaces.count("hidden.1.output"));
  EXPECT_TRUE(v.surfaces.count("optimizer.0.update"));
}

TEST_P(Verdict, AStragglerIsConfirmedOnEveryPeerAlike) {
  const auto [shape, n] = GetParam();
  const auto all = asPeers(
      layoutOf(shape, n), kChecked,
      [](std::size_t i) {
        CheckVote v = healthy();
        if (i == 0) v.repetitions["hidden.1"] = {0.090, 0.091, 0.090};
        return v;
      },
      3);
  expectSameEverywhere(all);
  if (n >= 3) {
    EXPECT_EQ(all[0].status, Status::kAttributed);
    EXPECT_TRUE(all[0].straggler_bitmap[0]);
    EXPECT_TRUE(all[0].sdc_sources.empty());
  } else {
    EXPECT_EQ(all[0].status, Status::kAgree);  // timing needs three peers
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Verdict,
                         ::testing::Combine(::testing::Values(Shape::kDdp, Shape::kFsdp, Shape::kHsdp),
                                            ::testing::Values(2, 4, 8, 16)));

TEST(Readiness, EveryPeerReadyWithOneContract) {
  PeerLayout l = layoutOf(Shape::kDdp, 4);
  std::vector<ReadinessVote> votes(4);
  for (auto& v : votes) {
    v.contracts["embedding"] = contractDigest({"step=3", "embedding"});
    v.contracts["hidden.0"] = contractDigest({"step=3", "hidden.0", "f32[2,8]"});
  }
  votes[2].contracts["hidden.0"] = contractDigest({"step=3", "hidden.0", "f32[2,9]"});
  votes[3].reasons["output"] = "missing_capture: the module was not called";
  const Readiness r = decideReadiness(l, {"embedding", "hidden.0", "output"}, votes);
  EXPECT_EQ(r.ready, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(r.reasons.at("hidden.0").rfind("contract_mismatch:", 0), 0u);
  EXPECT_EQ(r.reasons.at("output"), "missing_capture: the module was not called (rank 3)");
}

TEST(Readiness, LayoutsAndSurfacesAreChecked) {
  EXPECT_THROW(validate(PeerLayout{{0, 1, 1}, {}}), InvalidArgument);
  EXPECT_THROW(validate(PeerLayout{{0, 1}, {{0, 2}}}), InvalidArgument);
  EXPECT_THROW(validate(PeerLayout{{0, 1}, {{0}, {0, 1}}}), InvalidArgument);
  EXPECT_EQ(sourceRank(PeerLayout{{4, 5, 6}, {{4, 5, 6}}}, 7), 5);
  EXPECT_EQ(parseSurface("hidden.12.param_grad").recipe, "hidden.12");
  EXPECT_TRUE(parseSurface("optimizer.0.state").state);
  EXPECT_FALSE(parseSurface("embedding.output").state);
  EXPECT_THROW(parseSurface("output"), InvalidArgument);
  StragglerTracker t(StragglerOptions{});
  EXPECT_THROW(decideCheck(layoutOf(Shape::kDdp, 3), 1, {}, {}, std::vector<CheckVote>(2), t), InvalidArgument);
  EXPECT_THROW(validate(PeerLayout{{0, 1}, {{0, 1}}, {{0}, {0, 1}}}), InvalidArgument);
  EXPECT_THROW(validate(PeerLayout{{0, 1}, {{0, 1}}, {}, {{0, 3}}}), InvalidArgument);
  EXPECT_TRUE(parseSurface("moe.1.expert.5.params").expert);
  EXPECT_TRUE(parseSurface("moe.1.expert.5.params").state);
  EXPECT_FALSE(parseSurface("moe.1.router.output").expert);
  EXPECT_TRUE(parseSurface("moe.1.alltoall.routing").routing);
}

// MoE, dp=4 x ep=2 (ep innermost: rank = d * 2 + e): experts 0, 1 on even ranks, 2, 3 on odd ones.
PeerLayout moeLayout() {
  return PeerLayout{{0, 1, 2, 3, 4, 5, 6, 7},
                    {{0, 2, 4, 6}, {1, 3, 5, 7}},
                    {{0, 2, 4, 6}, {1, 3, 5, 7}},
                    {{0, 1}, {2, 3}, {4, 5}, {6, 7}}};
}

// What rank `r` votes at a healthy MoE check: the router (compared by all), its own experts
// (by the ranks holding them), and the routing of the AllToAll replay (balanced, then the two
// cyclic permutations of an expert-parallel pair: every segment intact).
CheckVote moeVote(std::size_t r) {
  CheckVote v;
  v.surfaces["moe.1.router.output"] = std::string(16, 'r');
  v.surfaces["moe.1.router.params"] = std::string(16, 'p');
  for (int e : r % 2 == 0 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}) {
    v.surfaces["moe.1.expert." + std::to_string(e) + ".output"] = std::string(16, static_cast<char>('a' + e));
    v.surfaces["moe.1.expert." + std::to_string(e) + ".params"] = std::string(16, static_cast<char>('k' + e));
  }
  // Per matrix (balanced, identity, swap), per sender: '-' no segment, '0' intact.
  v.surfaces["moe.1.alltoall.routing"] = r % 2 == 0 ? "000--0" : "00-00-";
  v.repetitions["moe.1"] = {0.004};
  return v;
}

TEST(MoeVerdict, HealthyExpertsAndRoutingAgree) {
  const auto all = asPeers(moeLayout(), {"moe.1"}, moeVote);
  expectSameEverywhere(all);
  EXPECT_EQ(all[0].status, Status::kAgree) << (all[0].inconclusive.empty() ? "" : all[0].inconclusive[0]);
  EXPECT_EQ(all[0].surfaces.size(), 2u + 8u + 1u);
}

TEST(MoeVerdict, AnExpertFaultIsAttributedWithinItsExpertGroup) {
  const auto all = asPeers(moeLayout(), {"moe.1"}, [](std::size_t r) {
    CheckVote v = moeVote(r);
    if (r == 5) v.surfaces["moe.1.expert.3.output"] = std::string(16, 'x');
    if (r == 2) v.surfaces["moe.1.expert.1.params"] = std::string(16, 'x');
    return v;
  });
  expectSameEverywhere(all);
  const CheckVerdict& v = all[0];
  EXPECT_EQ(v.status, Status::kAttributed);
  EXPECT_EQ(v.sdc_sources, (std::vector<std::string>{"moe.1.expert.1.params", "moe.1.expert.3.output"}));
  EXPECT_EQ(v.surfaces.at("moe.1.expert.3.output").bitmap, (std::vector<bool>{0, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(v.surfaces.at("moe.1.expert.1.params").bitmap, (std::vector<bool>{0, 0, 1, 0, 0, 0, 0, 0}));
}

TEST(MoeVerdict, ACorruptedSenderIsBlamedByItsReceivers) {
  // Rank 5 (expert-parallel position 1 of group {4, 5}) corrupts everything it sends.
  const auto all = asPeers(moeLayout(), {"moe.1"}, [](std::size_t r) {
    CheckVote v = moeVote(r);
    if (r == 4) v.surfaces["moe.1.alltoall.routing"] = "010--1";
    if (r == 5) v.surfaces["moe.1.alltoall.routing"] = "01-10-";
    return v;
  });
  expectSameEverywhere(all);
  EXPECT_EQ(all[0].status, Status::kAttributed);
  EXPECT_EQ(all[0].sdc_sources, (std::vector<std::string>{"moe.1.alltoall.routing"}));
  EXPECT_EQ(all[0].sdc_bitmap, (std::vector<bool>{0, 0, 0, 0, 0, 1, 0, 0}));
  // One bad link is no one's majority: Inconclusive, naming the segment.
  const auto link = asPeers(moeLayout(), {"moe.1"}, [](std::size_t r) {
    CheckVote v = moeVote(r);
    if (r == 2) v.surfaces["moe.1.alltoall.routing"] = "010--1";  // from rank 3 only, not 3's own copy
    return v;
  });
  EXPECT_EQ(link[0].status, Status::kInconclusive);
  EXPECT_EQ(link[0].reasons.at("moe.1.alltoall.routing").rfind("alltoall_segment:", 0), 0u);
}

TEST(MoeVerdict, AFailedMoeRecipeDropsEverySurfaceOfIt) {
  const auto all = asPeers(moeLayout(), {"moe.1"}, [](std::size_t r) {
    CheckVote v = moeVote(r);
    if (r == 3) {
      v.errors["moe.1"] = "RuntimeError: boom";
      v.surfaces["moe.1.expert.2.output"] = std::string(16, 'x');
    }
    return v;
  });
  expectSameEverywhere(all);
  EXPECT_EQ(all[0].status, Status::kInconclusive);
  EXPECT_TRUE(all[0].surfaces.empty());
  EXPECT_EQ(all[0].reasons.at("moe.1"), "replay_error: RuntimeError: boom (rank 3)");
}

}  // namespace
}  // namespace lmr::replay
