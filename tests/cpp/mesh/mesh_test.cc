#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/mesh/mesh.h"

namespace lmr::mesh {
namespace {

TEST(Mesh, DdpIsOneGroup) {
  Layout l({{"dp", 4, Role::kReplicate}}, 4);
  EXPECT_EQ(l.peerGroups(), (std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}}));
  EXPECT_FALSE(l.needsMaterialization());
}

TEST(Mesh, HsdpGroupsShareTheShardCoordinate) {
  // DeviceMesh (dp_replicate=2, dp_shard=4): rank = r * 4 + s.
  Layout l({{"dp_replicate", 2, Role::kReplicate}, {"dp_shard", 4, Role::kShard}}, 8);
  EXPECT_EQ(l.peerGroups(), (std::vector<std::vector<std::int64_t>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.peerGroupOf(6), (std::vector<std::int64_t>{2, 6}));
  EXPECT_EQ(l.coordinates(6), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(l.rankOf({1, 2}), 6);
  EXPECT_FALSE(l.needsMaterialization());
  // Replayed compute is compared across every data-parallel rank.
  EXPECT_EQ(l.computeGroups(), (std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

TEST(Mesh, PureFsdpComparesShardPeersAfterMaterialization) {
  Layout l({{"dp_shard", 4, Role::kShard}}, 4);
  EXPECT_EQ(l.peerGroups(), (std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}}));
  EXPECT_TRUE(l.needsMaterialization());
}

TEST(Mesh, ModelParallelCoordinatesSplitGroups) {
  // dp=2 x tp=2: peers share the TP coordinate.
  Layout l({{"dp", 2, Role::kReplicate}, {"tp", 2, Role::kModel}}, 4);
  EXPECT_EQ(l.peerGroups(), (std::vector<std::vector<std::int64_t>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(l.computeGroups(), (std::vector<std::vector<std::int64_t>>{{0, 2}, {1, 3}}));
}

TEST(Mesh, ExpertParallelismSplitsStateButNotDenseCompute) {
  // dp=4 x ep=2 (ep innermost): rank = d * 2 + e.
  Layout l({{"dp", 4, Role::kReplicate}, {"ep", 2, Role::kExpert}}, 8);
  EXPECT_TRUE(l.hasExperts());
  EXPECT_FALSE(l.needsMaterialization());
  // Dense modules: every rank replays the same thing.
  EXPECT_EQ(l.computeGroups(), (std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // Held state (dense and expert): the ranks holding the same experts.
  EXPECT_EQ(l.peerGroups(), (std::vector<std::vector<std::int64_t>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.expertGroups(), l.peerGroups());
  EXPECT_EQ(l.expertParallelGroups(), (std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  // Without experts: expert groups are the compute groups, every rank its own EP group.
  Layout dp({{"dp", 2, Role::kReplicate}, {"tp", 2, Role::kModel}}, 4);
  EXPECT_FALSE(dp.hasExperts());
  EXPECT_EQ(dp.expertGroups(), dp.computeGroups());
  EXPECT_EQ(dp.expertParallelGroups(), (std::vector<std::vector<std::int64_t>>{{0}, {1}, {2}, {3}}));
}

TEST(Mesh, RejectsBadLayouts) {
  EXPECT_THROW(Layout({{"dp", 3, Role::kReplicate}}, 4), InvalidArgument);
  EXPECT_THROW(Layout({}, 1), InvalidArgument);
  EXPECT_THROW(Layout({{"dp", 2, Role::kReplicate}, {"dp", 2, Role::kShard}}, 4), InvalidArgument);
  EXPECT_THROW(Layout({{"dp", 0, Role::kReplicate}}, 0), InvalidArgument);
}

}  // namespace
}  // namespace lmr::mesh
