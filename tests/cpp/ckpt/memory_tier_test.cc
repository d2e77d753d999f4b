#include "lmr/ckpt/memory_tier.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "lmr/common/error.h"

namespace lmr::ckpt {
namespace {

std::string memoryFailure(auto&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(MemoryTierRing, TheDefaultJumpIsOneNodeFurther) {
  EXPECT_EQ(defaultJump(8, 2), 2);
  EXPECT_EQ(defaultJump(4, 4), 1);  // one node: the next rank
  const ReplicaRing ring{8, 2, 2};
  EXPECT_NO_THROW(checkRing(ring));
  for (std::int64_t r = 0; r < 8; ++r) {
    EXPECT_NE(nodeOf(ring, holderOf(ring, r)), nodeOf(ring, r)) << r;
    EXPECT_EQ(ownerOf(ring, holderOf(ring, r)), r);
  }
  EXPECT_EQ(holderOf(ring, 7), 1);
  EXPECT_EQ(ownerOf(ring, 1), 7);
}

TEST(MemoryTierRing, AJumpThatKeepsAReplicaOnItsOwnNodeIsRefusedNamingTheRank) {
  EXPECT_NE(memoryFailure([] { checkRing({8, 2, 1}); }).find("keeps rank 0's replica on its own node (rank 1"),
            std::string::npos);
  EXPECT_NO_THROW(checkRing({8, 2, 3}));  // not a multiple of per_node, yet every holder is elsewhere
  EXPECT_NE(memoryFailure([] { checkRing({1, 1, 1}); }).find("world size 1"), std::string::npos);
  EXPECT_NE(memoryFailure([] { checkRing({6, 4, 4}); }).find("must divide the world size 6"), std::string::npos);
  EXPECT_NE(memoryFailure([] { checkRing({4, 2, 4}); }).find("must be in [1, 4)"), std::string::npos);
  EXPECT_NO_THROW(checkRing({4, 4, 1}));  // one node: allowed (survives a process, not the node)
}

TEST(MemoryTierRing, LosingTwoNodesLosesTheStateWhoseOwnerAndHolderWereBothThere) {
  const ReplicaRing ring{8, 2, 2};                           // nodes 0..3; rank r held on node r/2 + 1
  EXPECT_TRUE(lostOwners(ring, {1}).empty());                // one node: every state has a copy elsewhere
  EXPECT_EQ(lostOwners(ring, {1, 2}), (std::vector<std::int64_t>{2, 3}));  // node 1's ranks held on node 2
  EXPECT_TRUE(lostOwners(ring, {0, 2}).empty());             // not adjacent at this jump
  EXPECT_EQ(lostOwners({4, 4, 1}, {0}), (std::vector<std::int64_t>{0, 1, 2, 3}));
}

TEST(MemoryTierStaging, AutoStagesWhatFitsItsShareOfTheFreeDeviceMemory) {
  const std::uint64_t gib = std::uint64_t{1} << 30;
  EXPECT_TRUE(stageOnDevice(5 * gib, 70 * gib, 0.25));    // the reference state on an idle H100
  EXPECT_FALSE(stageOnDevice(20 * gib, 70 * gib, 0.25));  // more than a quarter of what is free
  EXPECT_TRUE(stageOnDevice(0, 0, 0.0));
  EXPECT_FALSE(stageOnDevice(1, 70 * gib, 0.0));  // share 0: never
  EXPECT_THROW(stageOnDevice(1, 1, 1.5), InvalidArgument);
  EXPECT_THROW(stageOnDevice(1, 1, std::nan("")), InvalidArgument);
}

TEST(MemoryTierBudget, ItFitsOrSaysByHowMuchItWouldNot) {
  constexpr std::uint64_t kMiB = 1024 * 1024;
  MemoryBudget b{100 * kMiB, 100 * kMiB, 2, 8192 * kMiB, 8, 0.25};
  EXPECT_EQ(nodeBytes(b), 2u * 8u * 200u * kMiB);
  EXPECT_NE(checkBudget(b), "");  // 3200 MiB against a quarter of 8 GiB
  b.fraction = 0.5;
  EXPECT_EQ(checkBudget(b), "");  // against half
}

TEST(MemoryTierBudget, OverTheShareIsRefusedWithTheSizes) {
  constexpr std::uint64_t kMiB = 1024 * 1024;
  const MemoryBudget b{300 * kMiB, 300 * kMiB, 2, 8192 * kMiB, 8, 0.25};  // 9600 MiB against 2048
  const std::string why = checkBudget(b);
  EXPECT_NE(why.find("needs 9600.0 MiB on this node (8 rank(s) x 2 slot(s) x (300.0 MiB own + 300.0 MiB held"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("(2048.0 MiB)"), std::string::npos) << why;
  EXPECT_NE(checkBudget({1, 1, 0, 1024, 1, 0.5}).find("slots must be at least 1"), std::string::npos);
  EXPECT_NE(checkBudget({1, 1, 1, 1024, 1, 0.0}).find("share must be in (0, 1]"), std::string::npos);
}

TEST(MemoryTierRestore, EachRankUsesItsOwnCopyFirstThenAHolder) {
  // Rank 2 is a spare: it has nothing; rank 3 holds rank 2's replica, rank 0 rank 3's.
  const auto plan = planRestore({{0, 3}, {1, 0}, {}, {3, 2}}, {0, 1, 2, 3});
  EXPECT_EQ(plan.missing, "");
  EXPECT_EQ(plan.transfers, (std::vector<Transfer>{{0, 0, 0}, {1, 1, 1}, {3, 2, 2}, {3, 3, 3}}));
}

TEST(MemoryTierRestore, TheSendsAreSpreadAndANeedNobodyHoldsIsNamed) {
  // Ranks 2 and 3 both need copies that ranks 0 and 1 both hold: one each.
  auto plan = planRestore({{2, 3}, {2, 3}, {}, {}}, {-1, -1, 2, 3});
  EXPECT_EQ(plan.transfers, (std::vector<Transfer>{{0, 2, 2}, {1, 3, 3}}));
  plan = planRestore({{0}, {}, {}}, {0, 1, 2});
  EXPECT_EQ(plan.missing, "no rank holds the snapshot of rank(s) 1, 2");
  EXPECT_NE(memoryFailure([] { planRestore({{}}, {0, 1}); }).find("1 supply lists for 2 ranks"), std::string::npos);
}

TEST(MemoryTierSlotHeader, RoundTripsAndRefusesWhatIsMalformedByField) {
  const SlotHeader h{12, 3, 8, "abc/def", 100, 4096, std::string(32, 'a')};
  EXPECT_EQ(parseSlotHeader(toJson(h)), h);
  EXPECT_NE(memoryFailure([] { parseSlotHeader("{", "slot.bin"); }).find("slot.bin"), std::string::npos);
  std::string text = toJson(h);
  auto with = [&](std::string from, std::string to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return memoryFailure([&] { parseSlotHeader(t); });
  };
  EXPECT_NE(with("\"step\":12", "\"step\":-1").find("step"), std::string::npos);
  EXPECT_NE(with("\"owner\":3", "\"owner\":9").find("owner: is 9, not a rank of 8"), std::string::npos);
  EXPECT_NE(with("\"schema_version\":1", "\"schema_version\":2").find("schema_version"), std::string::npos);
  EXPECT_NE(with(std::string(32, 'a'), "xyz").find("digest: must be 32 hex digits"), std::string::npos);
  EXPECT_NE(with("\"step\":12", "\"step\":12,\"extra\":1").find("extra"), std::string::npos);
  EXPECT_NE(with("\"lmr-memory-slot\"", "\"other\"").find("kind"), std::string::npos);
}

}  // namespace
}  // namespace lmr::ckpt
