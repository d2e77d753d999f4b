#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "lmr/common/sched.h"

namespace lmr {
namespace {

TEST(Sched, ThreadCountersGrowAndSleepIsNotWaiting) {
  const auto a = sched::threadTimes();
  if (!a) GTEST_SKIP() << "no /proc/thread-self/schedstat on this kernel";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto b = sched::threadTimes();
  ASSERT_TRUE(b.has_value());
  EXPECT_GE(b->wait_ns, a->wait_ns);
  // A sleeping thread is not waiting for a core: only its wake-up can be, which on a loaded
  // host takes a scheduler period or a few, far less than the 300 ms slept.
  EXPECT_LT(b->wait_ns - a->wait_ns, 200'000'000);
  volatile double x = 0;
  for (int i = 0; i < 2'000'000; ++i) x = x + i;
  const auto c = sched::threadTimes();
  ASSERT_TRUE(c.has_value());
  EXPECT_GT(c->cpu_ns, b->cpu_ns);
}

TEST(Sched, ActiveTimeIsWallMinusWaitBetweenCpuAndWall) {
  const sched::ThreadTimes zero{0, 0};
  EXPECT_EQ(sched::activeNs(100, zero, {30, 50}), 50);   // 30 computing, 20 sleeping, 50 preempted
  EXPECT_EQ(sched::activeNs(10, zero, {8, 40}), 8);      // the wait overstated: no less than the CPU time
  EXPECT_EQ(sched::activeNs(10, zero, {20, 0}), 10);     // never more than the wall time
  EXPECT_EQ(sched::activeNs(10, {5, 5}, {7, 6}), 9);
}

}  // namespace
}  // namespace lmr
