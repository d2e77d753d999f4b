#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lmr/campaign/journal.h"
#include "test_util.h"

namespace lmr::campaign {
namespace {

using json::Json;
using testing::baseManifest;

Campaign unit() { return Campaign::parse(baseManifest().dump()); }

std::string tempDir() {
  char pattern[] = "/tmp/lmr-journal-XXXXXX";
  return std::string(::mkdtemp(pattern));
}

TEST(Journal, RoundTripAndAttempts) {
  const Campaign c = unit();
  Journal j = Journal::fresh(c);
  EXPECT_EQ(j.attemptsAt("sdc", 10), 0);
  j = withAttempt(j, "sdc", 10, 1);
  EXPECT_EQ(j.attemptsAt("sdc", 10), 1);
  EXPECT_EQ(Journal::parse(j.dump()), j);
  EXPECT_NO_THROW(checkJournalBinding(j, c));
  EXPECT_EQ(j.dump(),
            "{\"attempts\":{\"sdc@10\":1},\"campaign\":\"unit\",\"manifest_identity\":\"" + c.identity() + "\"}");
}

TEST(Journal, RetriggerPolicies) {
  Json m = baseManifest();
  const Campaign once = Campaign::parse(m.dump());
  Journal j = Journal::fresh(once);
  EXPECT_EQ(nextAttempt(once.incidents()[0], 10, j), 1);
  j = withAttempt(j, "sdc", 10, 1);
  EXPECT_EQ(nextAttempt(once.incidents()[0], 10, j), std::nullopt);
  EXPECT_EQ(nextAttempt(once.incidents()[0], 20, j), 1);

  m["incidents"][0]["retrigger"] = "max_occurrences";
  m["incidents"][0]["max_occurrences"] = 2;
  const Campaign max2 = Campaign::parse(m.dump());
  Journal k = withAttempt(Journal::fresh(max2), "sdc", 10, 1);
  EXPECT_EQ(nextAttempt(max2.incidents()[0], 10, k), 2);
  k = withAttempt(k, "sdc", 10, 2);
  EXPECT_EQ(nextAttempt(max2.incidents()[0], 10, k), std::nullopt);

  m["incidents"][0]["retrigger"] = "every_attempt";
  m["incidents"][0].erase("max_occurrences");
  const Campaign every = Campaign::parse(m.dump());
  Journal e = withAttempt(Journal::fresh(every), "sdc", 10, 7);
  EXPECT_EQ(nextAttempt(every.incidents()[0], 10, e), 8);
}

TEST(Journal, MalformedJournalsAreRejectedWithPaths) {
  const Campaign c = unit();
  const std::string id = c.identity();
  auto error = [](const std::string& text) {
    try {
      Journal::parse(text, "state.json");
      return std::string();
    } catch (const InvalidArgument& e) {
      return e.message();
    }
  };
  auto doc = [&](const std::string& attempts, const std::string& extra = "") {
    return "{\"campaign\":\"unit\",\"manifest_identity\":\"" + id + "\",\"attempts\":" + attempts + extra + "}";
  };
  EXPECT_EQ(error(doc("{\"sdc@10\":1}")), "");
  EXPECT_EQ(error(doc("{\"sdc@010\":1}")).rfind("state.json: attempts[\"sdc@010\"]: not a candidate key", 0), 0u);
  EXPECT_EQ(error(doc("{\"sdc@10\":0}")).rfind("state.json: attempts[\"sdc@10\"]: must be a positive integer", 0), 0u);
  EXPECT_EQ(error(doc("{\"sdc@10\":-1}")).rfind("state.json: attempts[\"sdc@10\"]: must be a positive", 0), 0u);
  EXPECT_EQ(error(doc("{\"sdc@10\":true}")).rfind("state.json: attempts[\"sdc@10\"]: must be a JSON integer", 0), 0u);
  EXPECT_EQ(error(doc("{\"sdc@10\":1.0}")).rfind("state.json: attempts[\"sdc@10\"]: must be a JSON integer", 0), 0u);
  EXPECT_EQ(error(doc("{\"sdc@10#2\":1}")).rfind("state.json: attempts[\"sdc@10#2\"]: a candidate key has no", 0), 0u);
  EXPECT_EQ(error(doc("{\"sdc\":1}")).rfind("state.json: attempts.sdc: not a candidate key", 0), 0u);
  EXPECT_EQ(error(doc("[]")).rfind("state.json: attempts: must be an object", 0), 0u);
  EXPECT_EQ(error(doc("{}", ",\"extra\":1")).rfind("state.json: extra: unknown field", 0), 0u);
  EXPECT_EQ(error("{\"campaign\":\"unit\",\"attempts\":{}}").rfind("state.json: manifest_identity: required", 0), 0u);

  // Binding: other campaign, edited manifest, impossible attempts.
  Journal other{"another", id, {}};
  EXPECT_THROW(checkJournalBinding(other, c), InvalidArgument);
  Journal stale{"unit", "sha256:00", {}};
  try {
    checkJournalBinding(stale, c);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("stale"), std::string::npos);
  }
  EXPECT_THROW(checkJournalBinding(Journal{"unit", id, {{"sdc@11", 1}}}, c), InvalidArgument);    // not a candidate
  EXPECT_THROW(checkJournalBinding(Journal{"unit", id, {{"ghost@10", 1}}}, c), InvalidArgument);  // no such incident
  EXPECT_THROW(checkJournalBinding(Journal{"unit", id, {{"sdc@10", 2}}}, c), InvalidArgument);    // once, twice
}

TEST(StateStore, MemoryCompareAndSwap) {
  const Campaign c = unit();
  MemoryStateStore store;
  EXPECT_FALSE(store.load().has_value());
  const Journal a = Journal::fresh(c);
  EXPECT_TRUE(store.compareAndSwap(std::nullopt, a));
  EXPECT_FALSE(store.compareAndSwap(std::nullopt, a));
  const Journal b = withAttempt(a, "sdc", 10, 1);
  EXPECT_TRUE(store.compareAndSwap(a, b));
  EXPECT_FALSE(store.compareAndSwap(a, b));  // stale expectation
  EXPECT_EQ(store.load(), b);
  Journal foreign = b;
  foreign.campaign = "other";
  EXPECT_THROW(store.compareAndSwap(b, foreign), InvalidArgument);
  EXPECT_EQ(store.load(), b);  // nothing changed
}

TEST(StateStore, FileCompareAndSwapPersists) {
  const std::string dir = tempDir();
  const std::string path = dir + "/campaign-rank-0.json";
  const Campaign c = unit();
  {
    JsonFileStateStore store(path);
    EXPECT_FALSE(store.load().has_value());
    EXPECT_TRUE(store.compareAndSwap(std::nullopt, Journal::fresh(c)));
    EXPECT_TRUE(store.compareAndSwap(Journal::fresh(c), withAttempt(Journal::fresh(c), "sdc", 20, 1)));
  }
  JsonFileStateStore reopened(path);
  EXPECT_EQ(reopened.load(), withAttempt(Journal::fresh(c), "sdc", 20, 1));
  std::ofstream(path) << "{\"campaign\": \"unit\"";  // torn by hand: rejected, not guessed at
  EXPECT_THROW(reopened.load(), InvalidArgument);
  EXPECT_THROW(JsonFileStateStore(dir + "/missing-dir/x.json"), IoError);
  std::filesystem::remove_all(dir);
}

// Processes race to claim one `once` candidate: exactly one wins.
TEST(StateStore, ConcurrentProcessesClaimOnceExactlyOnce) {
  const std::string dir = tempDir();
  const std::string path = dir + "/journal.json";
  const Campaign c = unit();
  for (int round = 0; round < 5; ++round) {
    std::filesystem::remove(path);
    const int kWorkers = 8;
    std::vector<pid_t> pids;
    for (int w = 0; w < kWorkers; ++w) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        int claimed = 0;
        try {
          JsonFileStateStore store(path);
          for (;;) {  // load, decide, swap; retry when another worker changed the journal
            std::optional<Journal> current = store.load();
            const Journal base = current.value_or(Journal::fresh(c));
            auto attempt = nextAttempt(c.incidents()[0], 10, base);
            if (!attempt) break;
            if (store.compareAndSwap(current, withAttempt(base, "sdc", 10, *attempt))) {
              claimed = 1;
              break;
            }
          }
        } catch (...) {
          ::_exit(2);
        }
        ::_exit(claimed);
      }
      pids.push_back(pid);
    }
    int winners = 0;
    for (pid_t pid : pids) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFEXITED(status));
      ASSERT_NE(WEXITSTATUS(status), 2);
      winners += WEXITSTATUS(status);
    }
    EXPECT_EQ(winners, 1) << "round " << round;
    EXPECT_EQ(JsonFileStateStore(path).load()->attemptsAt("sdc", 10), 1);
  }
  std::filesystem::remove_all(dir);
}

// Writers killed at random moments never leave a torn journal: it is the old or the new one.
TEST(StateStore, KilledWritersLeaveOldOrNew) {
  const std::string dir = tempDir();
  const std::string path = dir + "/journal.json";
  Json m = baseManifest();
  m["incidents"][0]["retrigger"] = "every_attempt";
  m["incidents"][0]["trigger"] = Json{{"range", Json{{"start", 1}, {"end", 100000}}}};
  const Campaign c = Campaign::parse(m.dump());
  std::mt19937 rng(5);
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      JsonFileStateStore store(path);
      for (std::int64_t i = 1;; ++i) {  // ever larger journals
        std::optional<Journal> cur = store.load();
        Journal next = withAttempt(cur.value_or(Journal::fresh(c)), "sdc", 1 + (i % 5000), i);
        store.compareAndSwap(cur, next);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 20000));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    std::optional<Journal> j;
    ASSERT_NO_THROW(j = JsonFileStateStore(path).load()) << "round " << round;
    if (j) {
      EXPECT_NO_THROW(checkJournalBinding(*j, c));
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lmr::campaign
