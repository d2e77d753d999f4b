#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/consensus/consensus.h"

namespace lmr::consensus {
namespace {

std::vector<double> steady(int n, double base = 0.100) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) t.push_back(base + 0.0002 * ((i * 7) % 5));  // 0.1 .. 0.1008 s
  return t;
}

TEST(Timing, SteadyPeersAgree) {
  for (int n = 3; n <= 16; ++n) {
    auto r = timing(steady(n));
    EXPECT_EQ(r.status, Status::kAgree) << n;
  }
}

TEST(Timing, SlowMinorityAttributed) {
  for (int n = 3; n <= 16; ++n) {
    for (int k = 1; k <= (n - 1) / 2; ++k) {
      auto t = steady(n);
      std::vector<bool> expected(n, false);
      for (int j = 0; j < k; ++j) {
        t[2 * j + 1] += 0.050 + 0.01 * j;  // 50+ ms slower
        expected[2 * j + 1] = true;
      }
      auto r = timing(t);
      ASSERT_EQ(r.status, Status::kAttributed) << "n=" << n << " k=" << k;
      EXPECT_EQ(r.bitmap, expected);
    }
  }
}

TEST(Timing, FastPeerIsNotAStraggler) {
  auto t = steady(8);
  t[2] = 0.010;
  EXPECT_EQ(timing(t).status, Status::kAgree);
}

TEST(Timing, SmallDeviationsBelowThresholdsAreIgnored) {
  std::vector<double> t(8, 0.100);
  t[5] = 0.1009;  // above kappa * scale_floor, below the 1 ms absolute threshold
  EXPECT_EQ(timing(t).status, Status::kAgree);
  TimingOptions o;
  o.absolute_threshold = 0.0;
  o.relative_threshold = 0.0;
  EXPECT_EQ(timing(t, o).status, Status::kAttributed);
  o.relative_threshold = 0.5;  // would need 50 ms over a 100 ms median
  t[5] += 0.030;
  EXPECT_EQ(timing(t, o).status, Status::kAgree);
}

TEST(Timing, NoisyPeersNeedKappaScales) {
  // Peers spread by about +-10 ms: a 15 ms excess is within 3 robust scales.
  std::vector<double> t = {0.100, 0.110, 0.090, 0.105, 0.095, 0.100, 0.115, 0.085};
  t[3] = 0.115;
  auto r = timing(t);
  EXPECT_EQ(r.status, Status::kAgree);
  EXPECT_GT(r.scale, 0.005);
  t[3] = 0.200;
  EXPECT_EQ(timing(t).status, Status::kAttributed);
}

TEST(Timing, MedianMadAndScale) {
  std::vector<double> t = {1.0, 2.0, 3.0, 4.0};
  TimingOptions o;
  o.scale_floor = 0.0;
  auto r = timing(t, o);
  EXPECT_DOUBLE_EQ(r.median, 2.5);
  EXPECT_DOUBLE_EQ(r.mad, 1.0);
  EXPECT_DOUBLE_EQ(r.scale, 1.4826);
  o.scale_floor = 10.0;
  EXPECT_DOUBLE_EQ(timing(t, o).scale, 10.0);
}

TEST(Timing, TooFewPeersIsInconclusive) {
  EXPECT_EQ(timing(std::vector<double>{0.1, 5.0}).status, Status::kInconclusive);
  EXPECT_EQ(timing(std::vector<double>{0.1}).status, Status::kInconclusive);
  TimingOptions o;
  o.min_peers = 5;
  EXPECT_EQ(timing(std::vector<double>{0.1, 0.1, 0.1, 9.0}, o).status, Status::kInconclusive);
  EXPECT_EQ(timing(std::vector<double>{0.1, 0.1, 0.1, 0.1, 9.0}, o).status, Status::kAttributed);
}

TEST(Timing, RejectsBadInput) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(timing(std::vector<double>{0.1, nan, 0.1}), InvalidArgument);
  EXPECT_THROW(timing(std::vector<double>{0.1, -1.0, 0.1}), InvalidArgument);
  EXPECT_THROW(timing(std::vector<double>{}), InvalidArgument);
  TimingOptions o;
  o.kappa = -1;
  EXPECT_THROW(timing(steady(3), o), InvalidArgument);
}

}  // namespace
}  // namespace lmr::consensus
