#include "lmr/ckpt/manifest.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "lmr/common/error.h"

namespace lmr::ckpt {
namespace {

Manifest sample() {
  Manifest m;
  m.topology = "ab12";
  m.generation = 2;
  m.tainted_since = 17;
  m.checkpoints = {{"durable-4", 4, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/4", "ab12", "dense", 4},
                   {"latest-6", 6, Tier::kLatest, TrustState::kRejected, "", "ab12", "SDC detected at step 17", -1}};
  RecoveryDecision d;
  d.mode = "rollback_verified";
  d.source = "RECOVERY_VERIFIED";
  d.failure = "sdc";
  d.decided_at = 17;
  d.step = 4;
  d.checkpoint_id = "durable-4";
  d.location = "/ck/4";
  d.tier = "durable";
  d.topology = "ab12";
  d.available = true;
  d.reason = "detected SDC";
  m.decision = d;
  return m;
}

std::string errorOf(const std::string& text) {
  try {
    parseManifest(text);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(Manifest, RoundTrips) {
  const Manifest m = sample();
  EXPECT_EQ(parseManifest(toJson(m)), m);
  EXPECT_EQ(parseManifest(toJson(Manifest{})), Manifest{});
  EXPECT_EQ(parseDecision(toJson(*m.decision)), *m.decision);
}

TEST(Manifest, MalformedInputNamesTheJsonPath) {
  std::string text = toJson(sample(), -1);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_NE(errorOf(with("\"state\":\"REJECTED\"", "\"state\":\"latest\"")).find("checkpoints[1].state: unknown value"),
            std::string::npos);
  EXPECT_NE(errorOf(with("\"step\":6", "\"step\":3")).find("checkpoints[1].step: steps must not decrease"),
            std::string::npos);
  EXPECT_NE(errorOf(with("\"step\":6", "\"step\":6.5")).find("checkpoints[1].step"), std::string::npos);
  EXPECT_NE(errorOf(with("\"id\":\"latest-6\"", "\"id\":\"durable-4\"")).find("checkpoints[1].id: duplicate"),
            std::string::npos);
  EXPECT_NE(errorOf(with("\"generation\":2", "\"generation\":2,\"extra\":1")).find("extra: unknown field"),
            std::string::npos);
  EXPECT_NE(errorOf(with("\"schema_version\":2", "\"schema_version\":3")).find("schema_version: unsupported"),
            std::string::npos);
  EXPECT_NE(errorOf(with("\"available\":true", "\"available\":false")).find("decision.available"), std::string::npos);
  EXPECT_NE(errorOf(with("\"mode\":\"rollback_verified\"", "\"mode\":\"x\"")).find("decision.mode"), std::string::npos);
  EXPECT_NE(errorOf(text.substr(0, text.size() / 2)), "");  // torn
  EXPECT_NE(errorOf(""), "");
}

TEST(Manifest, WriteIsAtomicAndReadable) {
  char tmpl[] = "/tmp/lmr-ckpt-manifest-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/nested";
  EXPECT_FALSE(readManifest(dir));
  writeManifest(dir, sample());
  EXPECT_EQ(*readManifest(dir), sample());
  Manifest next = sample();
  next.generation = 3;
  writeManifest(dir, next);
  EXPECT_EQ(readManifest(dir)->generation, 3);
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temporary left behind
  {
    std::ofstream(manifestPath(dir)) << "{\"schema_version\": 1";
  }
  EXPECT_THROW(readManifest(dir), InvalidArgument);
  std::filesystem::remove_all(tmpl);
}

TEST(Manifest, AWriteRemovesTemporariesOfKilledWriters) {
  char tmpl[] = "/tmp/lmr-ckpt-stale-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // a writer that no longer exists
  const std::string dead = manifestPath(dir) + ".tmp." + std::to_string(child) + ".0";
  const std::string alive = manifestPath(dir) + ".tmp." + std::to_string(::getppid()) + ".0";
  std::ofstream(dead) << "{";
  std::ofstream(alive) << "{";
  writeManifest(dir, sample());
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(alive));  // its writer may still rename it
  EXPECT_EQ(*readManifest(dir), sample());
  std::filesystem::remove_all(dir);
}

// A decision written before it said whether the ranks leave reads as what it meant then: only
// an SDC sent them away. A non-boolean value is refused with its JSON path.
TEST(Manifest, ADecisionWithoutRestartReadsAsItsFailureMeantIt) {
  RecoveryDecision d = *sample().decision;
  for (const std::string failure : {"sdc", "hang"}) {
    d.failure = failure;
    d.restart = !d.restart;  // whatever it was: the old file does not say
    std::string text = toJson(d, -1);
    const std::string field = std::string(",\"restart\":") + (d.restart ? "true" : "false");
    ASSERT_NE(text.find(field), std::string::npos);
    text.erase(text.find(field), field.size());
    EXPECT_EQ(parseDecision(text).restart, failure == "sdc") << failure;
  }
  std::string bad = toJson(d, -1);
  const std::string value = std::string("\"restart\":") + (d.restart ? "true" : "false");
  bad.replace(bad.find(value), value.size(), "\"restart\":1");
  try {
    parseDecision(bad);
    ADD_FAILURE() << "accepted " << bad;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("restart"), std::string::npos) << e.message();
  }
}

// Each new decision keeps the one it replaces; version 1 manifests (before the history) read
// with an empty one, and a history in a version 1 document is refused as unknown.
TEST(Manifest, DecisionsAcrossGenerationsAreKept) {
  Manifest m = sample();
  const RecoveryDecision first = *m.decision;
  m.setDecision(first);  // the same decision again: no history entry
  EXPECT_TRUE(m.history.empty());
  RecoveryDecision second = first;
  second.decided_at = first.decided_at + 10;
  second.action = "escalate";
  m.setDecision(second);
  ASSERT_EQ(m.history.size(), 1u);
  EXPECT_EQ(m.history[0], first);
  EXPECT_EQ(parseManifest(toJson(m)), m);
  for (std::size_t i = 0; i < kDecisionHistory + 5; ++i) {
    second.decided_at += 1;
    m.setDecision(second);
  }
  EXPECT_EQ(m.history.size(), kDecisionHistory);

  std::string v1 = toJson(sample(), -1);
  v1.replace(v1.find("\"schema_version\":2"), 18, "\"schema_version\":1");
  const std::string empty_history = ",\"history\":[]";
  ASSERT_NE(v1.find(empty_history), std::string::npos) << v1;
  std::string with_history = v1;
  v1.erase(v1.find(empty_history), empty_history.size());
  Manifest old = parseManifest(v1);
  EXPECT_TRUE(old.history.empty());
  EXPECT_EQ(old.decision, sample().decision);
  EXPECT_NE(errorOf(with_history).find("history: unknown field"), std::string::npos) << errorOf(with_history);
}

}  // namespace
}  // namespace lmr::ckpt
