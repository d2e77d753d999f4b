#include <gtest/gtest.h>

#include <set>
#include <string>

#include "lmr/oob/collective_ops.h"

namespace lmr::oob {
namespace {

TEST(CollectiveOps, CodesAreDistinctAndBelowTheInternalRange) {
  std::set<std::uint32_t> codes;
  std::set<std::string_view> names;
  for (const CollectiveOp& op : collectiveOps()) {
    EXPECT_GT(op.code, 0u) << op.name;  // 0 is "no collective yet"
    EXPECT_LT(op.code, kFirstInternalCollectiveOp) << op.name;
    codes.insert(op.code);
    names.insert(op.name);
  }
  EXPECT_EQ(codes.size(), collectiveOps().size());
  EXPECT_EQ(names.size(), collectiveOps().size());
}

TEST(CollectiveOps, CodesAreStable) {
  auto code = [](std::string_view name) {
    for (const CollectiveOp& op : collectiveOps())
      if (op.name == name) return op.code;
    return 0u;
  };
  EXPECT_EQ(code("all_reduce"), 1u);
  EXPECT_EQ(code("barrier"), 10u);
  EXPECT_EQ(code("monitored_barrier"), 21u);
  EXPECT_EQ(code("reduce_scatter_single"), 23u);
}

TEST(FingerprintDigest, IsCrc32) {
  EXPECT_EQ(fingerprintDigest(""), 0u);
  EXPECT_EQ(fingerprintDigest("123456789"), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(fingerprintDigest("0,1,2,3"), 0x92CA0597u);     // zlib.crc32(b"0,1,2,3")
  EXPECT_NE(fingerprintDigest("0,1"), fingerprintDigest("0,2"));
}

}  // namespace
}  // namespace lmr::oob
