#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "lmr/oob/diagnose.h"

namespace lmr::oob {
namespace {

constexpr std::int64_t kS = 1'000'000'000;

std::vector<RankView> waitingInAllReduce(int n, std::uint64_t seq = 7) {
  std::vector<RankView> v(n);
  for (int r = 0; r < n; ++r) {
    v[r].rank = r;
    v[r].present = true;
    v[r].host = "node-" + std::to_string(r / 2);
    v[r].snapshot.step = 12;
    v[r].snapshot.in_collective = true;
    v[r].snapshot.collective = {1, 0, 99, 5, seq};
    v[r].stalled_ns = 31 * kS;
  }
  return v;
}

TEST(Diagnose, SkippedCollectiveIsADesyncOfTheMinority) {
  auto v = waitingInAllReduce(4);
  v[2].snapshot.collective.sequence = 8;  // rank 2 skipped one and waits in the next
  const auto r = diagnose(v);
  EXPECT_EQ(r.kind, "collective_desync");
  EXPECT_EQ(r.ranks, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(r.hosts, (std::vector<std::string>{"node-1"}));
  EXPECT_EQ(r.scope, "rank");
}

// The I/O rule as first written: each rank against the median of the others' typical
// durations, computed afresh per rank (quadratic; diagnose now sorts once).
std::vector<std::int64_t> ioStalledByMedianOfOthers(const std::vector<RankView>& v, const DiagnosisOptions& o) {
  const auto typical = [](const RankView& r) {
    return r.dataloader_ns > 0 ? r.dataloader_ns : r.snapshot.dataloader_last_ns;
  };
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::vector<std::int64_t> others;
    for (std::size_t j = 0; j < v.size(); ++j)
      if (j != i) others.push_back(typical(v[j]));
    std::sort(others.begin(), others.end());
    const std::int64_t median = others.empty() ? 0 : others[others.size() / 2];
    if (v[i].dataloader_ns > o.io_absolute_ns &&
        static_cast<double>(v[i].dataloader_ns) >
            o.io_relative * static_cast<double>(std::max<std::int64_t>(median, 1)) &&
        v[i].dataloader_observed_ns >= o.io_persistence_ns)
      out.push_back(v[i].rank);
  }
  return out;
}

TEST(Diagnose, IoStallsMatchTheMedianOfTheOthersOnRandomGroups) {
  std::mt19937_64 random(7);
  const DiagnosisOptions o;
  int attributed = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 2 + static_cast<int>(random() % 9);
    auto v = waitingInAllReduce(n);
    for (auto& r : v) {  // durations from a few values, so ties and even-sized groups are common
      const std::int64_t choices[] = {0, kS / 100, 2 * kS, 6 * kS, 30 * kS};
      r.snapshot.dataloader_last_ns = choices[random() % 5];
      if (random() % 3 == 0) {
        r.snapshot.in_collective = false;
        r.dataloader_ns = choices[random() % 5];
        r.dataloader_observed_ns = choices[random() % 5];
      }
    }
    const auto expected = ioStalledByMedianOfOthers(v, o);
    const auto report = diagnose(v, o);
    const bool minority = !expected.empty() && 2 * expected.size() < v.size();
    EXPECT_EQ(report.kind == "dataloader_stall", minority) << trial;
    if (minority) {
      EXPECT_EQ(report.ranks, expected) << trial;
      ++attributed;
    }
  }
  EXPECT_GT(attributed, 20);  // the random groups exercise the rule, not only its absence
}

TEST(Diagnose, RankOutsideCollectivesIsAProcessStall) {
  auto v = waitingInAllReduce(4);
  v[1].snapshot.in_collective = false;  // stuck computing, or SIGSTOPped
  EXPECT_EQ(diagnose(v).kind, "process_stall");
  EXPECT_EQ(diagnose(v).ranks, (std::vector<std::int64_t>{1}));
}

TEST(Diagnose, IoStallsNeedAllThresholds) {
  auto v = waitingInAllReduce(4);
  v[3].snapshot.in_collective = false;
  v[3].dataloader_ns = 30 * kS;
  v[3].dataloader_observed_ns = 29 * kS;
  for (int r = 0; r < 3; ++r) v[r].snapshot.dataloader_last_ns = kS / 100;  // peers' next() takes 10 ms
  auto r = diagnose(v);
  EXPECT_EQ(r.kind, "dataloader_stall");
  EXPECT_EQ(r.ranks, (std::vector<std::int64_t>{3}));
  v[3].dataloader_observed_ns = kS;  // the daemon has not watched it persist yet
  EXPECT_EQ(diagnose(v).kind, "process_stall");
  v[3].dataloader_observed_ns = 29 * kS;
  for (int r = 0; r < 3; ++r) v[r].snapshot.dataloader_last_ns = 10 * kS;  // peers' loader is slow too
  EXPECT_EQ(diagnose(v).kind, "process_stall");
  for (int r = 0; r < 3; ++r) v[r].snapshot.dataloader_last_ns = kS / 100;
  v[3].dataloader_ns = 1 * kS;  // below the absolute threshold: a plain process stall
  EXPECT_EQ(diagnose(v).kind, "process_stall");
  auto w = waitingInAllReduce(4);
  w[0].snapshot.in_collective = false;
  w[0].checkpoint_ns = 40 * kS;
  w[0].checkpoint_observed_ns = 40 * kS;
  EXPECT_EQ(diagnose(w).kind, "checkpoint_io_stall");
  EXPECT_EQ(diagnose(w).ranks, (std::vector<std::int64_t>{0}));
  // Everyone slow in I/O together is not one rank's fault.
  for (auto& x : w) x.checkpoint_ns = x.checkpoint_observed_ns = 40 * kS;
  EXPECT_NE(diagnose(w).kind, "checkpoint_io_stall");
}

TEST(Diagnose, StallCommonToAllIsGroupScoped) {
  const auto r = diagnose(waitingInAllReduce(4));
  EXPECT_EQ(r.kind, "group_stall");
  EXPECT_EQ(r.scope, "peer_group");
  EXPECT_TRUE(r.ranks.empty());
}

TEST(Diagnose, NoMajorityIsInconclusiveAndMissingDaemonsAreNamed) {
  auto v = waitingInAllReduce(4);
  v[0].snapshot.collective.sequence = 8;
  v[1].snapshot.collective.sequence = 9;
  EXPECT_EQ(diagnose(v).kind, "inconclusive_stall");
  auto m = waitingInAllReduce(4);
  m[3].present = false;
  const auto r = diagnose(m);
  EXPECT_EQ(r.missing_ranks, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(r.kind, "unresponsive_rank");
  EXPECT_EQ(r.ranks, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(r.hosts, (std::vector<std::string>{"node-1"}));
  EXPECT_EQ(toJson(r)["missing_ranks"][0], 3);
  // Half the group is not a majority: nothing is attributed.
  m[2].present = false;
  EXPECT_EQ(diagnose(m).kind, "inconclusive_stall");
  EXPECT_TRUE(diagnose(m).ranks.empty());
}

}  // namespace
}  // namespace lmr::oob
