#include "lmr/moe/alltoall.h"

#include <gtest/gtest.h>

#include "lmr/common/error.h"

namespace lmr::moe {
namespace {

using consensus::Status;

TEST(MoeAllToAll, DefaultMatricesReachEveryReceiverTwice) {
  const auto ms = defaultMatrices(3, 4);
  ASSERT_EQ(ms.size(), 4u);
  EXPECT_EQ(ms[0], (Matrix{{4, 4, 4}, {4, 4, 4}, {4, 4, 4}}));
  EXPECT_EQ(ms[1], (Matrix{{4, 0, 0}, {0, 4, 0}, {0, 0, 4}}));  // the local copy
  EXPECT_EQ(ms[2], (Matrix{{0, 4, 0}, {0, 0, 4}, {4, 0, 0}}));
  for (const Matrix& m : ms) EXPECT_NO_THROW(validateMatrix(m, 3));
  EXPECT_THROW(defaultMatrices(0, 4), InvalidArgument);
  EXPECT_THROW(defaultMatrices(2, 0), InvalidArgument);
}

TEST(MoeAllToAll, LargeGroupsReplayABoundedSetOfShiftsSpreadOverTheGroup) {
  EXPECT_EQ(defaultShifts(8), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(defaultShifts(64), (std::vector<std::int64_t>{0, 8, 16, 24, 32, 40, 48, 56}));
  EXPECT_EQ(defaultShifts(10, 4), (std::vector<std::int64_t>{0, 2, 5, 7}));
  const auto ms = defaultMatrices(64, 1);
  ASSERT_EQ(ms.size(), 9u);  // the balanced matrix and 8 shifts, not 65 matrices
  EXPECT_EQ(ms[2][3][11], 1);  // shift 8
  EXPECT_THROW(defaultShifts(4, 0), InvalidArgument);
}

TEST(MoeAllToAll, MatricesAreValidatedWithTheEntryNamed) {
  try {
    validateMatrix({{1, 2}, {3, -1}}, 2, "policy.matrices[4]");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("policy.matrices[4][1][1] is negative"), std::string::npos) << e.what();
  }
  EXPECT_THROW(validateMatrix({{1, 2}}, 2), InvalidArgument);
  EXPECT_THROW(validateMatrix({{1, 2}, {3}}, 2), InvalidArgument);
  EXPECT_THROW(validateMatrix({{0, 0}, {0, 0}}, 2), InvalidArgument);
}

TEST(MoeAllToAll, VotesMarkMissingIntactAndCorruptedSegments) {
  const auto ms = defaultMatrices(2, 1);
  EXPECT_EQ(routingVote(ms, 0, {{false, true}, {false, false}, {false, false}}), "010--0");
  EXPECT_THROW(routingVote(ms, 2, {{false, false}, {false, false}, {false, false}}), InvalidArgument);
  EXPECT_THROW(routingVote(ms, 0, {{false, false}}), InvalidArgument);
}

// The votes of a group of `n` under the default matrices when `sender` corrupts everything
// it sends and `receiver` everything it gets (-1: nobody).
std::vector<std::string> groupVotes(std::int64_t n, std::int64_t sender, std::int64_t receiver,
                                    std::pair<std::int64_t, std::int64_t> link = {-1, -1}) {
  const auto ms = defaultMatrices(n, 2);
  std::vector<std::string> out;
  for (std::int64_t j = 0; j < n; ++j) {
    std::vector<std::vector<bool>> bad(ms.size(), std::vector<bool>(static_cast<std::size_t>(n), false));
    for (auto& row : bad)
      for (std::int64_t i = 0; i < n; ++i)
        row[static_cast<std::size_t>(i)] = i == sender || j == receiver || (i == link.first && j == link.second);
    out.push_back(routingVote(ms, j, bad));
  }
  return out;
}

TEST(MoeAllToAll, SenderAndReceiverFaultsAreLocalizedInEveryGroupSize) {
  for (std::int64_t n : {2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 33}) {
    for (std::int64_t r = 0; r < n; ++r) {
      for (bool as_sender : {true, false}) {
        const RoutingVerdict v = decideRouting(groupVotes(n, as_sender ? r : -1, as_sender ? -1 : r));
        EXPECT_EQ(v.status, Status::kAttributed) << n << " " << r;
        for (std::int64_t k = 0; k < n; ++k) EXPECT_EQ(v.bitmap[static_cast<std::size_t>(k)], k == r) << n;
        EXPECT_TRUE(v.reason.empty()) << v.reason;
      }
    }
    const RoutingVerdict clean = decideRouting(groupVotes(n, -1, -1));
    EXPECT_EQ(clean.status, Status::kAgree);
  }
}

TEST(MoeAllToAll, ALinkOrAMissingVoteIsInconclusive) {
  const RoutingVerdict link = decideRouting(groupVotes(4, -1, -1, {1, 2}));
  EXPECT_EQ(link.status, Status::kInconclusive);
  EXPECT_EQ(link.bitmap, std::vector<bool>(4, false));
  EXPECT_NE(link.reason.find("from expert-parallel position 1 to position 2"), std::string::npos) << link.reason;
  auto votes = groupVotes(4, -1, -1);
  votes[3].clear();
  EXPECT_EQ(decideRouting(votes).status, Status::kInconclusive);
  votes = groupVotes(4, -1, -1);
  votes[1][0] = '?';
  EXPECT_EQ(decideRouting(votes).status, Status::kInconclusive);
  EXPECT_THROW(decideRouting({}), InvalidArgument);
}

}  // namespace
}  // namespace lmr::moe
