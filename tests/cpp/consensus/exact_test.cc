#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/consensus/consensus.h"

namespace lmr::consensus {
namespace {

std::vector<std::string> agreeing(int n) { return std::vector<std::string>(n, std::string("\x01\x02\x03", 3)); }

TEST(Exact, AllEqualAgree) {
  for (int n = 1; n <= 16; ++n) {
    auto r = exact(agreeing(n));
    EXPECT_EQ(r.status, Status::kAgree) << n;
    EXPECT_EQ(r.majority_count, static_cast<std::size_t>(n));
    EXPECT_EQ(std::count(r.bitmap.begin(), r.bitmap.end(), true), 0);
  }
}

// For every N in 3..16 and every outlier count 1..floor((N-1)/2), placed at random
// positions with distinct or shared wrong values, exactly the outliers are attributed.
TEST(Exact, MinorityOutliersAttributed) {
  std::mt19937 rng(7);
  for (int n = 3; n <= 16; ++n) {
    for (int k = 1; k <= (n - 1) / 2; ++k) {
      for (bool shared_wrong_value : {false, true}) {
        std::vector<int> positions(n);
        std::iota(positions.begin(), positions.end(), 0);
        std::shuffle(positions.begin(), positions.end(), rng);
        auto evidence = agreeing(n);
        std::vector<bool> expected(n, false);
        for (int j = 0; j < k; ++j) {
          evidence[positions[j]] = shared_wrong_value ? std::string("bad") : "bad" + std::to_string(j);
          expected[positions[j]] = true;
        }
        std::vector<std::int64_t> ranks(n);
        for (int i = 0; i < n; ++i) ranks[i] = 100 + 2 * i;
        auto r = exact(evidence, ranks);
        ASSERT_EQ(r.status, Status::kAttributed) << "n=" << n << " k=" << k;
        EXPECT_EQ(r.bitmap, expected);
        EXPECT_EQ(r.majority_count, static_cast<std::size_t>(n - k));
        auto attributed = r.attributedRanks();
        ASSERT_EQ(attributed.size(), static_cast<std::size_t>(k));
        for (std::int64_t rank : attributed) EXPECT_TRUE(expected[(rank - 100) / 2]);
      }
    }
  }
}

TEST(Exact, TwoPeersDisagreeingIsInconclusive) {
  auto r = exact(std::vector<std::string>{"a", "b"});
  EXPECT_EQ(r.status, Status::kInconclusive);
  EXPECT_EQ(std::count(r.bitmap.begin(), r.bitmap.end(), true), 0);
  EXPECT_EQ(r.majority_position, -1);
}

TEST(Exact, TiesAndPluralitiesAreInconclusive) {
  EXPECT_EQ(exact(std::vector<std::string>{"a", "a", "b", "b"}).status, Status::kInconclusive);
  EXPECT_EQ(exact(std::vector<std::string>{"a", "a", "b", "b", "c"}).status, Status::kInconclusive);
  EXPECT_EQ(exact(std::vector<std::string>{"a", "b", "c"}).status, Status::kInconclusive);
  // Half is not a strict majority.
  EXPECT_EQ(exact(std::vector<std::string>{"a", "a", "a", "b", "c", "d"}).status, Status::kInconclusive);
  EXPECT_EQ(exact(std::vector<std::string>{"a", "a", "a", "a", "c", "d"}).status, Status::kAttributed);
}

TEST(Exact, DecisionDoesNotDependOnPeerOrder) {
  std::mt19937 rng(11);
  std::vector<std::string> evidence = {"x", "y", "x", "x", "z", "x", "x"};
  std::vector<std::int64_t> ranks = {3, 9, 4, 7, 1, 0, 5};
  auto base = exact(evidence, ranks);
  auto base_ranks = base.attributedRanks();
  std::sort(base_ranks.begin(), base_ranks.end());
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int> order(evidence.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::string> e;
    std::vector<std::int64_t> r;
    for (int i : order) {
      e.push_back(evidence[i]);
      r.push_back(ranks[i]);
    }
    auto result = exact(e, r);
    auto got = result.attributedRanks();
    std::sort(got.begin(), got.end());
    EXPECT_EQ(result.status, base.status);
    EXPECT_EQ(got, base_ranks);
  }
  EXPECT_EQ(base_ranks, (std::vector<std::int64_t>{1, 9}));
}

TEST(Exact, EvidenceIsKeptInPeerOrder) {
  std::vector<std::string> evidence = {"p", "q", "p"};
  auto r = exact(evidence);
  EXPECT_EQ(r.evidence, evidence);
  EXPECT_EQ(r.peer_ranks, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(r.majority_position, 0);
}

TEST(Exact, EmptyStringsAreEvidenceToo) {
  auto r = exact(std::vector<std::string>{"", "", std::string("\0", 1)});
  EXPECT_EQ(r.status, Status::kAttributed);
  EXPECT_EQ(r.attributedRanks(), (std::vector<std::int64_t>{2}));
}

TEST(Exact, RejectsBadInput) {
  EXPECT_THROW(exact(std::vector<std::string>{}), InvalidArgument);
  std::vector<std::int64_t> short_ranks = {0, 1};
  EXPECT_THROW(exact(agreeing(3), short_ranks), InvalidArgument);
  std::vector<std::int64_t> repeated = {0, 1, 1};
  EXPECT_THROW(exact(agreeing(3), repeated), InvalidArgument);
}

TEST(Status, TheWorseOfTwoVerdictsAndTheNamesBack) {
  using consensus::Status;
  EXPECT_EQ(consensus::worse(Status::kAgree, Status::kInconclusive), Status::kInconclusive);
  EXPECT_EQ(consensus::worse(Status::kInconclusive, Status::kAttributed), Status::kAttributed);
  EXPECT_EQ(consensus::worse(Status::kAttributed, Status::kInconclusive), Status::kAttributed);
  EXPECT_EQ(consensus::worse(Status::kAgree, Status::kAgree), Status::kAgree);
  for (Status s : {Status::kAgree, Status::kAttributed, Status::kInconclusive})
    EXPECT_EQ(consensus::parseStatus(consensus::statusName(s)), s);
  EXPECT_THROW(consensus::parseStatus("agree"), InvalidArgument);
}

}  // namespace
}  // namespace lmr::consensus
