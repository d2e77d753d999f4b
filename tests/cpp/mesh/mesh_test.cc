#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/mesh/mesh.h"
#include "lmr/replay/verdict.h"

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

// Under tensor parallelism every TP group of the source replica replays a block together:
// the compute groups of one pipeline stage (one per TP coordinate) must all pick their
// source in the same data-parallel replica, and each TP group must have exactly one rank in
// each of them. Layouts as TorchTitan orders them (pp, dp_replicate, fsdp, tp), up to
// 8 x 128 x 16 (16,384 ranks).
TEST(Mesh, TensorParallelReplayPicksOneSourceReplicaPerStage) {
  struct Case {
    std::int64_t pp, replicate, shard, tp;
  };
  for (const Case c : {Case{1, 1, 3, 2}, Case{1, 2, 2, 2}, Case{2, 1, 3, 2}, Case{1, 4, 8, 8}, Case{8, 8, 16, 16}}) {
    std::vector<Dim> dims;
    if (c.pp > 1) dims.push_back({"pp", c.pp, Role::kModel});
    if (c.replicate > 1) dims.push_back({"dp_replicate", c.replicate, Role::kReplicate});
    dims.push_back({"fsdp", c.shard, Role::kShard});
    dims.push_back({"tp", c.tp, Role::kModel});
    const std::int64_t world = c.pp * c.replicate * c.shard * c.tp;
    const Layout l(dims, world);
    const auto groups = l.computeGroups();
    ASSERT_EQ(static_cast<std::int64_t>(groups.size()), c.pp * c.tp) << world;
    const std::size_t pp_dim = 0, tp_dim = dims.size() - 1;
    for (std::int64_t step : {0, 1, 7, 12345}) {
      std::vector<std::int64_t> replica_of_stage(static_cast<std::size_t>(c.pp), -1);
      for (const auto& g : groups) {
        ASSERT_EQ(static_cast<std::int64_t>(g.size()), c.replicate * c.shard);
        const auto source = l.coordinates(replay::sourceRank(replay::PeerLayout{g, {}}, step));
        const auto first = l.coordinates(g.front());
        EXPECT_EQ(source[tp_dim], first[tp_dim]);  // the group's own TP coordinate
        const std::int64_t stage = c.pp > 1 ? source[pp_dim] : 0;
        // The data-parallel coordinates, as one index: the same in every TP coordinate.
        std::int64_t replica = 0;
        for (std::size_t d = c.pp > 1 ? 1 : 0; d < tp_dim; ++d) replica = replica * dims[d].size + source[d];
        auto& seen = replica_of_stage[static_cast<std::size_t>(stage)];
        if (seen < 0) seen = replica;
        EXPECT_EQ(seen, replica) << "step " << step << ", world " << world;
      }
    }
  }
}

TEST(Mesh, RejectsBadLayouts) {
  EXPECT_THROW(Layout({{"dp", 3, Role::kReplicate}}, 4), InvalidArgument);
  EXPECT_THROW(Layout({}, 1), InvalidArgument);
  EXPECT_THROW(Layout({{"dp", 2, Role::kReplicate}, {"dp", 2, Role::kShard}}, 4), InvalidArgument);
  EXPECT_THROW(Layout({{"dp", 0, Role::kReplicate}}, 0), InvalidArgument);
}

}  // namespace
}  // namespace lmr::mesh
