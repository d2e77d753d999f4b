#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "lmr/common/error.h"
#include "lmr/oob/progress.h"

namespace lmr::oob {
namespace {

std::string uniqueName(const char* tag) { return segmentName("test", 0, ::getpid(), tag, 0); }

TEST(Progress, WriterAndReaderRoundTrip) {
  const std::string name = uniqueName("roundtrip");
  ProgressWriter w(name, std::string(16, 'a'));
  ProgressReader r(name);
  auto s = r.snapshot();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->step, 0u);
  EXPECT_EQ(s->steps_here, 0u);
  EXPECT_EQ(s->layer, -1);
  EXPECT_EQ(s->owner_pid, ::getpid());
  w.layerEntered(3);
  w.layerEntered(4);
  w.collectiveEntered({2, 0, 77, 88, 5});
  s = r.snapshot();
  EXPECT_EQ(s->layer, 4);
  EXPECT_EQ(s->layer_calls, 2u);
  EXPECT_TRUE(s->in_collective);
  EXPECT_EQ(s->collective, (CollectiveFingerprint{2, 0, 77, 88, 5}));
  w.collectiveExited();
  w.stepCompleted(9);
  w.dataloaderBegin();
  s = r.snapshot();
  EXPECT_EQ(s->step, 9u);
  EXPECT_EQ(s->steps_here, 1u);  // a resumed job's first step is 9: this process completed one
  EXPECT_EQ(s->layer, -1);
  EXPECT_FALSE(s->in_collective);
  EXPECT_GT(s->dataloader_since_ns, 0);
  w.dataloaderEnd();
  w.checkpointBegin();
  w.checkpointEnd();
  s = r.snapshot();
  EXPECT_EQ(s->dataloader_since_ns, 0);
  EXPECT_GE(s->dataloader_last_ns, 0);
  EXPECT_EQ(s->checkpoint_since_ns, 0);
}

// A reader racing a writer never sees a half-written record.
TEST(Progress, SnapshotsAreConsistentUnderConcurrentWrites) {
  const std::string name = uniqueName("race");
  ProgressWriter w(name, std::string(16, 'b'));
  ProgressReader r(name);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (std::uint64_t i = 1; !stop.load(); ++i)
      w.collectiveEntered({static_cast<std::uint32_t>(i), 0, i, i * 3, i * 7});
  });
  int checked = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (checked < 20000 && std::chrono::steady_clock::now() < deadline) {
    auto s = r.snapshot();
    if (!s || s->collective.sequence == 0) continue;
    const auto& c = s->collective;
    ASSERT_EQ(c.meta, c.group * 3);
    ASSERT_EQ(c.sequence, c.group * 7);
    ASSERT_EQ(c.op, static_cast<std::uint32_t>(c.group));
    ++checked;
  }
  stop = true;
  writer.join();
  EXPECT_EQ(checked, 20000);
}

TEST(Progress, OwnershipIsRespectedAndDeadOwnersAreReclaimed) {
  const std::string name = uniqueName("owner");
  {
    ProgressWriter owner(name, std::string(16, 'c'));
    EXPECT_THROW(ProgressWriter(name, std::string(16, 'd')), InvalidArgument);  // live owner, other token
  }
  // A child creates the segment and dies without cleaning up.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* leaked = new ProgressWriter(name, std::string(16, 'e'));
    (void)leaked;
    ::_exit(0);
  }
  ::waitpid(child, nullptr, 0);
  ProgressWriter reclaimed(name, std::string(16, 'f'));  // the owner is dead: reclaimed
  EXPECT_EQ(ProgressReader(name).snapshot()->owner_pid, ::getpid());
  EXPECT_THROW(ProgressWriter(name, std::string(15, 'g')), InvalidArgument);
}

// The observer removes a record its dead owner left behind, and only then.
TEST(Progress, ObserverUnlinksOnlyADeadOwnersRecord) {
  const std::string name = uniqueName("cleanup");
  {
    ProgressWriter mine(name, std::string(16, 'h'));
    EXPECT_FALSE(ProgressReader::unlinkIfOwnerDead(name, ::getpid()));  // alive
  }
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* leaked = new ProgressWriter(name, std::string(16, 'i'));
    (void)leaked;
    [[maybe_unused]] const ssize_t n = ::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_FALSE(ProgressReader::unlinkIfOwnerDead(name, child));          // still running
  EXPECT_FALSE(ProgressReader::unlinkIfOwnerDead(name, child + 100000));  // not its owner
  ::kill(child, SIGKILL);
  for (int i = 0; i < 200 && ProgressReader(name).snapshot()->owner_pid == child; ++i) {
    if (ProgressReader::unlinkIfOwnerDead(name, child)) break;  // dead, even as an unreaped zombie
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_THROW(ProgressReader{name}, IoError);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
}

// An owner killed while creating its record (opened, not yet sized or initialised): the
// record is still removed once the owner is gone, never while it lives.
TEST(Progress, AHalfCreatedRecordOfADeadOwnerIsRemoved) {
  const std::string name = uniqueName("half");
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_FALSE(ProgressReader::unlinkIfOwnerDead(name, ::getpid()));  // alive: left alone
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(ProgressReader::unlinkIfOwnerDead(name, child));
  EXPECT_LT(::shm_open(name.c_str(), O_RDONLY, 0), 0);
  EXPECT_FALSE(ProgressReader::unlinkIfOwnerDead(name, child));  // nothing left to remove
}

TEST(Progress, SegmentNamesAreScopedAndValid) {
  std::set<std::string> names;
  for (std::string run : {"a", "b"})
    for (int gen : {0, 1})
      for (int rank : {0, 1}) names.insert(segmentName(run, gen, 42, "dp", rank));
  EXPECT_EQ(names.size(), 8u);
  for (const auto& n : names) {
    EXPECT_EQ(n.rfind("/lmr-", 0), 0u);
    EXPECT_EQ(n.find('/', 1), std::string::npos);
    EXPECT_EQ(n.size(), 5u + 24u);
  }
  EXPECT_THROW(ProgressReader("/lmr-does-not-exist"), IoError);
}

}  // namespace
}  // namespace lmr::oob
