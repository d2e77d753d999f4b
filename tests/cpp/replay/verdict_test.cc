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
}

}  // namespace
}  // namespace lmr::replay
