// RDMA port counters read from a sysfs tree the test writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lmr/common/error.h"
#include "lmr/mesh/fabric.h"

namespace lmr::mesh {
namespace {
namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

class Sysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root =
        fs::temp_directory_path() / ("lmr-fabric-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                     "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    for (const char* nic : {"mlx5_0", "mlx5_1"}) {
      write(root / nic / "ports" / "1" / "state", "4: ACTIVE");
      write(root / nic / "ports" / "1" / "counters" / "symbol_error", "0");
      write(root / nic / "ports" / "1" / "counters" / "link_downed", "0");
    }
  }
  void TearDown() override { fs::remove_all(root); }
  fs::path root;
};

TEST_F(Sysfs, ANicIsDegradedWhileItsErrorsGrowOrAPortIsDown) {
  InfinibandCounters source(root.string());
  auto r = source.poll();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].name, "mlx5_0");
  EXPECT_FALSE(r[0].degraded || r[1].degraded);  // the first poll records the counters
  write(root / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error", "12");
  r = source.poll();
  EXPECT_FALSE(r[0].degraded);
  EXPECT_TRUE(r[1].degraded);
  EXPECT_EQ(r[1].detail, "port 1 symbol_error +12");
  EXPECT_FALSE(source.poll()[1].degraded);  // no new errors since
  write(root / "mlx5_0" / "ports" / "1" / "state", "1: DOWN");
  r = source.poll();
  EXPECT_TRUE(r[0].degraded);
  EXPECT_EQ(r[0].detail, "port 1 1: DOWN");
}

TEST_F(Sysfs, OnlyTheNicsAskedForAndNoneIsUnsupported) {
  EXPECT_EQ(InfinibandCounters(root.string(), {"mlx5_1"}).nics(), std::vector<std::string>{"mlx5_1"});
  EXPECT_THROW(InfinibandCounters((root / "nothing").string()), Unsupported);
  EXPECT_THROW(InfinibandCounters(root.string(), {"mlx5_9"}), Unsupported);
  // A port whose state cannot be read is an I/O error, not a healthy port.
  InfinibandCounters source(root.string());
  fs::remove(root / "mlx5_0" / "ports" / "1" / "state");
  EXPECT_THROW(source.poll(), IoError);
}

}  // namespace
}  // namespace lmr::mesh
