#include <gtest/gtest.h>

#include <set>

#include "lmr/common/error.h"
#include "lmr/mesh/comm.h"
#include "lmr/replay/replay.h"

namespace lmr {
namespace {

TEST(Replay, CadenceAndRotation) {
  replay::Cadence c;
  c.check_interval = 10;
  const auto iv = replay::effectiveIntervals(c, 4);
  EXPECT_EQ(iv.embedding, 10);
  EXPECT_EQ(iv.hidden, 10);  // 4 layers x 10 <= 100
  EXPECT_EQ(replay::effectiveIntervals(c, 32).hidden, 3);  // 32 layers: every 3 steps -> 96 steps
  EXPECT_TRUE(replay::planAt(c, 7, 4, 2).empty());
  const auto p = replay::planAt(c, 10, 4, 2);
  EXPECT_EQ(p.recipeIds(), (std::vector<std::string>{"embedding", "hidden.0", "output", "optimizer.0"}));
  EXPECT_EQ(replay::planAt(c, 20, 4, 2).recipeIds(),
            (std::vector<std::string>{"embedding", "hidden.1", "output", "optimizer.1"}));
  // Every layer within 100 steps, whatever the depth, at the default cadence too.
  for (const replay::Cadence& cadence : {c, replay::Cadence{}}) {
    for (std::int64_t layers : {1, 3, 4, 10, 32, 80, 100}) {
      std::set<std::int64_t> seen;
      for (std::int64_t step = 1; step <= 100; ++step)
        if (auto h = replay::planAt(cadence, step, layers, 1).hidden_layer) seen.insert(*h);
      EXPECT_EQ(static_cast<std::int64_t>(seen.size()), layers) << layers;
    }
  }
  replay::Cadence manual;
  manual.check_interval = 0;
  EXPECT_TRUE(replay::planAt(manual, 10, 4, 1).empty());
  replay::Cadence custom;
  custom.output_interval = 0;
  custom.optimizer_interval = 5;
  EXPECT_EQ(replay::planAt(custom, 5, 4, 3).recipeIds(), (std::vector<std::string>{"optimizer.0"}));
  EXPECT_EQ(replay::fullPlan(6, 4, 3).recipeIds(),
            (std::vector<std::string>{"embedding", "hidden.1", "output", "optimizer.2"}));
  replay::Cadence bad;
  bad.hidden_interval = -2;
  EXPECT_THROW(replay::planAt(bad, 1, 4, 1), InvalidArgument);
}

// The worst case over every onset step of a persistent fault in each layer, found by walking
// planAt, is what worstCaseLatency says.
TEST(Replay, WorstCaseLatencyIsTheLongestWaitForAVisit) {
  for (std::int64_t check : {1, 7, 20}) {
    for (std::int64_t layers : {1, 4, 6, 16}) {
      for (bool pipelined : {false, true}) {
        replay::Cadence c;
        c.check_interval = check;
        const std::int64_t slices = 3;
        const auto l = replay::worstCaseLatency(c, layers, slices, 0, pipelined);
        std::int64_t worst_hidden = 0, worst_output = 0, worst_slice = 0;
        const std::int64_t horizon = 4 * check * std::max<std::int64_t>(layers, slices);
        for (std::int64_t onset = 1; onset <= horizon / 2; ++onset) {
          for (std::int64_t layer = 0; layer < layers; ++layer) {
            std::int64_t t = onset;
            while (replay::planAt(c, t, layers, slices).hidden_layer != layer) ++t;
            worst_hidden = std::max(worst_hidden, t - onset + 1);
          }
          std::int64_t t = onset;
          while (!replay::planAt(c, t, layers, slices).output) ++t;
          worst_output = std::max(worst_output, t - onset + 1);
          for (std::int64_t slice = 0; slice < slices; ++slice) {
            t = onset;
            while (replay::planAt(c, t, layers, slices).optimizer_slice != slice) ++t;
            worst_slice = std::max(worst_slice, t - onset + 1);
          }
        }
        const std::int64_t late = pipelined ? 1 : 0;
        EXPECT_EQ(l.hidden, worst_hidden + late) << check << " " << layers;
        EXPECT_EQ(l.output, worst_output + late) << check << " " << layers;
        EXPECT_EQ(l.embedding, l.output);
        EXPECT_EQ(l.optimizer, worst_slice + late) << check << " " << layers;
        EXPECT_EQ(l.moe, 0);
        EXPECT_EQ(l.modules, std::max(l.hidden, l.output));
      }
    }
  }
  // The default cadence on 16 layers: a layer every 6 steps, every layer within 96 (97 when
  // pipelined); MoE layers rotate as well; a recipe that is off is never (0).
  replay::Cadence d;
  EXPECT_EQ(replay::worstCaseLatency(d, 16, 1, 0, true).hidden, 97);
  replay::Cadence longer{.coverage_steps = 200};  // a longer rotation: every 12 steps, 192
  EXPECT_EQ(replay::effectiveIntervals(longer, 16).hidden, 12);
  EXPECT_EQ(replay::worstCaseLatency(longer, 16, 1, 0, true).hidden, 193);
  EXPECT_EQ(replay::effectiveIntervals(longer, 16, 4).moe, 50);
  EXPECT_EQ(replay::effectiveIntervals(replay::Cadence{.check_interval = 5, .coverage_steps = 1000}, 16).hidden, 5);
  EXPECT_THROW(replay::effectiveIntervals(replay::Cadence{.coverage_steps = 0}, 16), InvalidArgument);
  EXPECT_EQ(replay::worstCaseLatency(d, 16, 1, 4, false).moe, 100);
  d.output_interval = 0;
  EXPECT_EQ(replay::worstCaseLatency(d, 16, 1, 0, false).output, 0);
  EXPECT_THROW(replay::worstCaseLatency(d, 16, 0, 0, false), InvalidArgument);
}

TEST(Replay, MoeLayersRotateLikeHiddenLayers) {
  replay::Cadence c;
  c.check_interval = 10;
  EXPECT_EQ(replay::effectiveIntervals(c, 4).moe, 0);  // no MoE layers: no MoE recipe
  EXPECT_FALSE(replay::planAt(c, 10, 4, 1).moe_layer);
  EXPECT_EQ(replay::effectiveIntervals(c, 4, 2).moe, 10);
  EXPECT_EQ(replay::effectiveIntervals(c, 40, 40).moe, 2);  // every MoE layer within 100 steps
  EXPECT_EQ(replay::planAt(c, 10, 4, 1, 2).moe_layer, 0);
  EXPECT_EQ(replay::planAt(c, 20, 4, 1, 2).moe_layer, 1);
  EXPECT_EQ(replay::planAt(c, 30, 4, 1, 2).recipeIds().back(), "moe.0");
  c.moe_interval = 0;
  EXPECT_FALSE(replay::planAt(c, 10, 4, 1, 2).moe_layer);
  c.moe_interval = 5;
  EXPECT_EQ(replay::planAt(c, 5, 4, 1, 2).recipeIds(), (std::vector<std::string>{"moe.0"}));
  EXPECT_EQ(replay::fullPlan(4, 4, 1, 3).moe_layer, 0);
  EXPECT_FALSE(replay::fullPlan(4, 4, 1).moe_layer);
  c.moe_interval = -3;
  EXPECT_THROW(replay::planAt(c, 5, 4, 1, 2), InvalidArgument);
  EXPECT_THROW(replay::planAt(replay::Cadence{}, 5, 4, 1, -1), InvalidArgument);
}

TEST(Replay, CatalogListsWhatACycleCovers) {
  using V = std::vector<std::string>;
  EXPECT_EQ(replay::catalog(replay::Cadence{}, {0, 2}, 2),
            (V{"embedding", "hidden.0", "hidden.2", "output", "optimizer.0", "optimizer.1"}));
  EXPECT_EQ(
      replay::catalog(replay::Cadence{.check_interval = 10, .embedding_interval = 0, .output_interval = 0}, {3}, 0),
      (V{"hidden.3"}));
  EXPECT_EQ(replay::catalog(replay::Cadence{.check_interval = 0}, {1}, 1),
            (V{"embedding", "hidden.1", "output", "optimizer.0"}));
  EXPECT_THROW(replay::catalog(replay::Cadence{}, {}, 1), InvalidArgument);
  EXPECT_EQ(replay::catalog(replay::Cadence{}, {0, 1}, 0, {1}),
            (V{"embedding", "hidden.0", "hidden.1", "output", "moe.1"}));
  EXPECT_EQ(replay::catalog(replay::Cadence{.check_interval = 0}, {0}, 0, {0}),
            (V{"embedding", "hidden.0", "output", "moe.0"}));
  EXPECT_EQ(replay::catalog(replay::Cadence{.moe_interval = 0}, {0}, 0, {0}), (V{"embedding", "hidden.0", "output"}));
  EXPECT_EQ(replay::catalog(replay::Cadence{}, {}, 0, {0, 1}), (V{"embedding", "output", "moe.0", "moe.1"}));
}

TEST(Replay, StateSourcesAreParamsAndState) {
  EXPECT_TRUE(replay::isStateSource("hidden.1.params"));
  EXPECT_TRUE(replay::isStateSource("optimizer.0.state"));
  EXPECT_FALSE(replay::isStateSource("optimizer.0.update"));
  EXPECT_FALSE(replay::isStateSource("embedding.output"));
  EXPECT_FALSE(replay::isStateSource("params.output"));
}

TEST(Replay, ContractDigestIsFieldExact) {
  const auto a = replay::contractDigest({"step=10", "hidden.1", "f32[2,16,64]"});
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a, replay::contractDigest({"step=10", "hidden.1", "f32[2,16,64]"}));
  EXPECT_NE(a, replay::contractDigest({"step=10", "hidden.1", "f32[2,16,63]"}));
  EXPECT_NE(replay::contractDigest({"ab", "c"}), replay::contractDigest({"a", "bc"}));  // length-prefixed
}

// One repetition per peer: the timings as the tracker's repetition lists.
std::vector<std::vector<double>> once(const std::vector<double>& seconds) {
  std::vector<std::vector<double>> out;
  for (double s : seconds) out.push_back({s});
  return out;
}

replay::StragglerOptions kOfN(std::int64_t k, std::int64_t n, std::int64_t window = 100) {
  replay::StragglerOptions o;
  o.confirmation_rounds = k;
  o.confirmation_checks = n;
  o.temporal_window = window;
  return o;
}

const std::vector<std::int64_t> kRanks = {0, 1, 2, 3};
const std::vector<double> kSlow2 = {0.10, 0.10, 0.40, 0.10};
const std::vector<double> kEven = {0.10, 0.10, 0.10, 0.10};

TEST(Replay, DefaultStragglerThresholdsIgnoreMillisecondNoise) {
  // A replay of a few ms: 3 ms slower than its peers is host noise, not a straggler (the
  // generic timing consensus would call it an outlier); 8 ms slower is.
  replay::StragglerTracker t{replay::StragglerOptions{}};
  const std::vector<double> noisy = {0.010, 0.010, 0.013, 0.010};
  const std::vector<double> slow = {0.010, 0.010, 0.018, 0.010};
  EXPECT_FALSE(t.observe("hidden.0", 1, once(noisy), kRanks).check.bitmap[2]);
  EXPECT_TRUE(consensus::timing(noisy, consensus::TimingOptions{}, kRanks).bitmap[2]);
  EXPECT_TRUE(t.observe("hidden.0", 2, once(slow), kRanks).check.bitmap[2]);
}

TEST(Replay, StragglersNeedKOfTheLastNChecks) {
  replay::StragglerTracker t(kOfN(3, 5));
  EXPECT_FALSE(t.observe("hidden.0", 10, once(kSlow2), kRanks).confirmed[2]);
  EXPECT_FALSE(t.observe("hidden.0", 20, once(kSlow2), kRanks).confirmed[2]);
  // One check disturbed by noise (the straggler looked normal) does not break the build-up.
  EXPECT_FALSE(t.observe("hidden.0", 30, once(kEven), kRanks).confirmed[2]);
  const auto v = t.observe("hidden.0", 40, once(kSlow2), kRanks);
  EXPECT_TRUE(v.confirmed[2]);
  EXPECT_EQ(v.outlier_checks[2], 3);
  EXPECT_EQ(v.check.status, consensus::Status::kAttributed);
  EXPECT_FALSE(v.confirmed[0]);
  EXPECT_TRUE(t.observe("hidden.0", 50, once(kSlow2), kRanks).confirmed[2]);
  // Recipes are tracked apart.
  EXPECT_FALSE(t.observe("hidden.1", 50, once(kSlow2), kRanks).confirmed[2]);
}

TEST(Replay, ConfirmedStragglerIsReportedOnlyWhileItsCheckSaysSlow) {
  replay::StragglerTracker t(kOfN(3, 5));
  for (std::int64_t step : {1, 2, 3}) t.observe("hidden.0", step, once(kSlow2), kRanks);
  EXPECT_TRUE(t.observe("hidden.0", 4, once(kSlow2), kRanks).confirmed[2]);
  // It recovered: not reported, and one noisy outlier right after is not a confirmation.
  EXPECT_FALSE(t.observe("hidden.0", 5, once(kEven), kRanks).confirmed[2]);
  auto v = t.observe("hidden.0", 6, once(kSlow2), kRanks);
  EXPECT_FALSE(v.confirmed[2]);
  EXPECT_EQ(v.outlier_checks[2], 1);
  EXPECT_FALSE(t.observe("hidden.0", 7, once(kSlow2), kRanks).confirmed[2]);
  EXPECT_TRUE(t.observe("hidden.0", 8, once(kSlow2), kRanks).confirmed[2]);  // three fresh rounds
}

TEST(Replay, NoisyOutliersOnHealthyPeersNeverConfirm) {
  replay::StragglerTracker t(kOfN(3, 5));
  // A different peer is noisy each time, and none twice within five checks of a recipe.
  for (std::int64_t step = 1; step <= 40; ++step) {
    std::vector<double> s = kEven;
    s[step % 4] = 0.40;
    if (step % 3 != 0) s = kEven;
    const auto v = t.observe("hidden.0", step, once(s), kRanks);
    for (bool c : v.confirmed) EXPECT_FALSE(c) << step;
  }
}

TEST(Replay, FastestRepetitionIsThePeersEvidence) {
  replay::StragglerTracker t(kOfN(1, 1));
  // Peer 1 had one noisy repetition; peer 2 is slow in all of them.
  const std::vector<std::vector<double>> reps = {{0.10, 0.11}, {0.90, 0.10}, {0.40, 0.41}, {0.10, 0.12}};
  const auto v = t.observe("hidden.0", 1, reps, kRanks);
  EXPECT_EQ(v.check.evidence, (std::vector<double>{0.10, 0.10, 0.40, 0.10}));
  EXPECT_EQ(v.confirmed, (std::vector<bool>{false, false, true, false}));
  EXPECT_THROW(t.observe("hidden.0", 2, {{0.1}, {}, {0.1}, {0.1}}, kRanks), InvalidArgument);
  EXPECT_DOUBLE_EQ(replay::fastestRepetition({0.3, 0.2, 0.5}), 0.2);
}

TEST(Replay, StragglerRoundsExpireAndNeedThreePeers) {
  replay::StragglerTracker t(kOfN(3, 5));
  // Rounds spread wider than the window do not confirm.
  EXPECT_FALSE(t.observe("output", 10, once(kSlow2), kRanks).confirmed[2]);
  EXPECT_FALSE(t.observe("output", 80, once(kSlow2), kRanks).confirmed[2]);
  EXPECT_FALSE(t.observe("output", 150, once(kSlow2), kRanks).confirmed[2]);
  // Inconclusive checks (here: rank 2 compared with one other peer) count neither way.
  replay::StragglerTracker u(kOfN(3, 3));
  u.observe("x", 1, once(kSlow2), kRanks);
  u.observe("x", 2, once(kSlow2), kRanks);
  EXPECT_EQ(u.observe("x", 3, once({0.1, 0.1}), {2, 3}).check.status, consensus::Status::kInconclusive);
  EXPECT_TRUE(u.observe("x", 4, once(kSlow2), kRanks).confirmed[2]);
  // Two peers can never confirm anyone.
  replay::StragglerTracker two(kOfN(3, 5));
  for (int i = 1; i <= 5; ++i) EXPECT_FALSE(two.observe("x", i, once({0.1, 0.9}), {0, 1}).confirmed[1]);
  EXPECT_THROW(replay::StragglerTracker(kOfN(3, 2)), InvalidArgument);
}

TEST(StragglerDefaults, HostClockNeedsTwentyMillisecondsDeviceClockFive) {
  const replay::StragglerOptions host = replay::stragglerDefaults(true);
  const replay::StragglerOptions device = replay::stragglerDefaults(false);
  EXPECT_DOUBLE_EQ(host.timing.absolute_threshold, 0.020);
  EXPECT_DOUBLE_EQ(device.timing.absolute_threshold, replay::StragglerOptions{}.timing.absolute_threshold);
  EXPECT_EQ(host.confirmation_rounds, device.confirmation_rounds);
  // A peer 10 ms over the median of quick replays is an outlier on the device clock only.
  const std::vector<std::vector<double>> times{{0.001}, {0.001}, {0.001}, {0.011}};
  EXPECT_FALSE(replay::StragglerTracker{host}.observe("hidden.0", 1, times, {0, 1, 2, 3}).check.bitmap[3]);
  EXPECT_TRUE(replay::StragglerTracker{device}.observe("hidden.0", 1, times, {0, 1, 2, 3}).check.bitmap[3]);
}

TEST(CheckDefaults, OneDecisionForEveryClockDependentDefault) {
  const replay::CheckDefaults host = replay::checkDefaults(true);
  const replay::CheckDefaults device = replay::checkDefaults(false);
  EXPECT_FALSE(host.pipelined);
  EXPECT_TRUE(device.pipelined);
  EXPECT_EQ(host.timing_repeats, 3);
  EXPECT_EQ(device.timing_repeats, 1);
  EXPECT_FALSE(host.state_integrity);
  EXPECT_TRUE(device.state_integrity);
  EXPECT_DOUBLE_EQ(host.comm_absolute_s, 0.020);
  EXPECT_DOUBLE_EQ(device.comm_absolute_s, mesh::CommOptions{}.timing.absolute_threshold);
  EXPECT_DOUBLE_EQ(host.straggler.timing.absolute_threshold, replay::stragglerDefaults(true).timing.absolute_threshold);
  EXPECT_TRUE(replay::integrityAtRestByDefault(false, 8));  // shards: no replica to compare
  EXPECT_TRUE(replay::integrityAtRestByDefault(true, 2));
  EXPECT_FALSE(replay::integrityAtRestByDefault(true, 3));
}

TEST(Plan, WhatTheFrameworkCannotReplayIsLeftOutOfEveryPlan) {
  const replay::Cadence every{1, -1, -1, -1, -1, -1};
  const replay::Plan all = replay::planAt(every, 3, 4, 2, 2);
  EXPECT_TRUE(all.embedding && all.hidden_layer && all.output && all.optimizer_slice && all.moe_layer);
  const replay::Plan no_modules = replay::planAt(every, 3, 4, 2, 2, {.modules = false});
  EXPECT_FALSE(no_modules.embedding || no_modules.hidden_layer || no_modules.output || no_modules.moe_layer);
  EXPECT_EQ(no_modules.optimizer_slice, all.optimizer_slice);
  const replay::Plan no_optimizer = replay::fullPlan(3, 4, 2, 2, {.optimizer = false});
  EXPECT_FALSE(no_optimizer.optimizer_slice.has_value());
  EXPECT_TRUE(no_optimizer.embedding && no_optimizer.hidden_layer && no_optimizer.moe_layer);
  EXPECT_TRUE(replay::fullPlan(3, 4, 2, 0, {false, false}).empty());
  EXPECT_EQ(replay::kRecipeClasses[3], "optimizer");
}

}  // namespace
}  // namespace lmr
