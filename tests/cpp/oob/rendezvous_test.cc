#include <gtest/gtest.h>

#include <set>

#include "lmr/oob/rendezvous.h"

namespace lmr::oob {
namespace {

// Expected values from the formula the Python package used before the port moved to C++:
//   h = int.from_bytes(hashlib.sha256(f"lmr-oob|{run_id}|{master_port}".encode()).digest()[:8], "big")
//   port = 20000 + (h + generation) % 30000  (the next one when it equals master_port)
TEST(DerivedPort, MatchesThePythonFormula) {
  EXPECT_EQ(derivedPort("run", 0, 29500), 23185);
  EXPECT_EQ(derivedPort("run", 7, 29500), 23192);
  EXPECT_EQ(derivedPort("run-a", 0), 44789);
  EXPECT_EQ(derivedPort("run-b", 0), 41916);
  EXPECT_EQ(derivedPort("job-42", 3), 22548);
  EXPECT_EQ(derivedPort("", 0), 41338);
  EXPECT_EQ(derivedPort("r1", 3, 29500), 38964);
  EXPECT_EQ(derivedPort("job", std::int64_t{1} << 62), 42865);  // no overflow
}

TEST(DerivedPort, NeverTheMasterPort) {
  // Generation 22868 of run "x" lands on 25000 itself: the next port is used.
  EXPECT_EQ(derivedPort("x", 22868, 25000), 25001);
  EXPECT_EQ(derivedPort("x", 22867, 25000), 24999);
}

TEST(DerivedPort, GenerationsStepThroughTheRange) {
  std::set<std::int64_t> ports;
  for (int g = 0; g < 50; ++g) {
    const std::int64_t p = derivedPort("run", g, 29500);
    EXPECT_GE(p, kDerivedPortBase);
    EXPECT_LT(p, kDerivedPortBase + kDerivedPortSpan);
    ports.insert(p);
  }
  EXPECT_EQ(ports.size(), 50u);
}

}  // namespace
}  // namespace lmr::oob
