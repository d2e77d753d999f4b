#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lmr/campaign/schedule.h"
#include "lmr/common/keyed_hash.h"
#include "lmr/common/sha256.h"
#include "test_util.h"

namespace lmr::campaign {
namespace {

using json::Json;
using testing::baseManifest;
using testing::readExample;

std::shared_ptr<const Campaign> parsed(const Json& m) {
  return std::make_shared<const Campaign>(Campaign::parse(m.dump()));
}

TEST(Schedule, DueCandidatesInIterationOrder) {
  auto c = std::make_shared<const Campaign>(Campaign::parse(readExample("mixed-production-failures.json")));
  Schedule s(c, 0, 0);
  std::vector<std::pair<std::int64_t, std::size_t>> seen;
  for (std::int64_t it = 1; it <= 1000; ++it) {
    for (const Candidate& cand : s.dueAt(it)) {
      EXPECT_EQ(cand.iteration, it);
      EXPECT_EQ(cand.position, it);
      seen.emplace_back(it, cand.incident);
    }
  }
  std::vector<std::pair<std::int64_t, std::size_t>> expected = {{37, 0}, {203, 0}, {911, 0}};
  for (std::int64_t it = 300; it <= 500; it += 20) expected.emplace_back(it, 1);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(seen, expected);
  EXPECT_FALSE(s.nextDue().has_value());
}

TEST(Schedule, CampaignStartOriginShiftsPositions) {
  Json m = baseManifest();
  m["clock"] = Json{{"origin", "campaign_start"}};
  Schedule s(parsed(m), 100, 100);  // enabled after 100 completed iterations
  EXPECT_EQ(s.nextDue(), 110);
  auto due = s.dueAt(110);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].position, 10);
  EXPECT_EQ(due[0].iteration, 110);
}

TEST(Schedule, ResumeAndRewindSkipPastCandidates) {
  Json m = baseManifest();
  m["incidents"][0]["trigger"] = Json{{"range", Json{{"start", 5}, {"end", 1000000000}, {"every", 5}}}};
  Schedule s(parsed(m), 0, 12);
  EXPECT_EQ(s.nextDue(), 15);
  EXPECT_TRUE(s.dueAt(14).empty());
  EXPECT_EQ(s.dueAt(15).size(), 1u);
  // A jump over candidates passes them over and catches up.
  EXPECT_TRUE(s.dueAt(33).empty());
  EXPECT_EQ(s.nextDue(), 35);
  s.rewind(4);  // rollback to a checkpoint after iteration 4
  EXPECT_EQ(s.nextDue(), 5);
  s.rewind(999999999);
  EXPECT_EQ(s.nextDue(), 1000000000);
  s.dueAt(1000000000);
  EXPECT_FALSE(s.nextDue().has_value());
}

TEST(Schedule, ProbabilisticSelectionIsDeterministicAndCalibrated) {
  Json m = baseManifest();
  m["seed"] = 12345;
  m["incidents"][0]["trigger"] = Json{{"range", Json{{"start", 1}, {"end", 20000}}}, {"probability", 0.25}};
  auto a = parsed(m);
  auto b = parsed(m);
  int selected = 0;
  for (std::int64_t pos = 1; pos <= 20000; ++pos) {
    const bool sa = isSelected(*a, a->incidents()[0], pos);
    ASSERT_EQ(sa, isSelected(*b, b->incidents()[0], pos));
    selected += sa ? 1 : 0;
  }
  EXPECT_NEAR(selected / 20000.0, 0.25, 0.015);  // about 5 standard deviations
  m["seed"] = 12346;  // another seed selects other candidates
  auto c = parsed(m);
  int same = 0;
  for (std::int64_t pos = 1; pos <= 2000; ++pos) {
    same += isSelected(*a, a->incidents()[0], pos) == isSelected(*c, c->incidents()[0], pos) ? 1 : 0;
  }
  EXPECT_LT(same, 1800);
  m["incidents"][0]["trigger"]["probability"] = 0;
  auto never = parsed(m);
  m["incidents"][0]["trigger"]["probability"] = 1;
  auto always = parsed(m);
  for (std::int64_t pos = 1; pos <= 100; ++pos) {
    EXPECT_FALSE(isSelected(*never, never->incidents()[0], pos));
    EXPECT_TRUE(isSelected(*always, always->incidents()[0], pos));
  }
}

TEST(Schedule, KeyedHashIsTheDocumentedDefinition) {
  // Frozen, and computed independently with Python's hashlib from the definition in
  // keyed_hash.h: changing it changes which occurrences every manifest selects.
  EXPECT_EQ(keyedHash(17, "campaign.select", {"intermittent-straggler"}, 300), 0x9550afbaa9a75ae6ull);
  EXPECT_EQ(keyedHash(-1, "campaign.select", {"x"}, 5), 0xb7b9e16abbb80470ull);
  EXPECT_EQ(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex(std::string(1000, 'a')), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Schedule, OccurrenceAndInjectionIds) {
  EXPECT_EQ(occurrenceId("network-delay", 500), "network-delay@500");
  EXPECT_EQ(occurrenceId("network-delay", 500, 2), "network-delay@500#2");
  EXPECT_EQ(injectionId("a@5#3", "f"), "a@5#3/f");
  const OccurrenceKey k = parseOccurrenceId("with@at@17#4");
  EXPECT_EQ(k.incident_id, "with@at");
  EXPECT_EQ(k.position, 17);
  EXPECT_EQ(k.attempt, 4);
  for (const char* bad : {"x@017", "x@0", "x@-3", "@5", "x5", "x@5#1", "x@5#02", "x@5#", "x@99999999999999999999"}) {
    EXPECT_THROW(parseOccurrenceId(bad), InvalidArgument) << bad;
  }
}

Trigger at(std::vector<std::int64_t> v) {
  Trigger t;
  t.at = std::move(v);
  return t;
}
Trigger range(std::int64_t s, std::int64_t e, std::int64_t k) {
  Trigger t;
  t.is_range = true;
  t.start = s;
  t.end = e;
  t.every = k;
  return t;
}

std::vector<std::int64_t> candidates(const Trigger& t) {
  std::vector<std::int64_t> out;
  for (auto x = t.firstAtOrAfter(1); x; x = t.firstAtOrAfter(*x + 1)) out.push_back(*x);
  return out;
}

bool bruteOverlap(const Trigger& a, std::optional<std::int64_t> wa, const Trigger& b, std::optional<std::int64_t> wb) {
  for (std::int64_t x : candidates(a))
    for (std::int64_t y : candidates(b)) {
      const bool ab = y >= x && (!wa || y <= x + *wa - 1);
      const bool ba = x >= y && (!wb || x <= y + *wb - 1);
      if (ab || ba) return true;
    }
  return false;
}

TEST(Overlap, MatchesBruteForceOnRandomSchedules) {
  std::mt19937 rng(99);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto randomTrigger = [&]() {
    if (pick(0, 2) == 0) {
      std::set<std::int64_t> s;
      const int n = pick(1, 6);
      while (static_cast<int>(s.size()) < n) s.insert(pick(1, 120));
      return at(std::vector<std::int64_t>(s.begin(), s.end()));
    }
    const int start = pick(1, 60);
    return range(start, start + pick(0, 120), pick(1, 17));
  };
  auto randomWindow = [&]() -> std::optional<std::int64_t> {
    if (pick(0, 9) == 0) return std::nullopt;
    return pick(1, 9);
  };
  for (int trial = 0; trial < 20000; ++trial) {
    const Trigger a = randomTrigger(), b = randomTrigger();
    const auto wa = randomWindow(), wb = randomWindow();
    const auto hit = firstWindowOverlap(a, wa, b, wb);
    ASSERT_EQ(hit.has_value(), bruteOverlap(a, wa, b, wb)) << "trial " << trial;
    if (hit) {
      ASSERT_TRUE(a.isCandidate(hit->first) && b.isCandidate(hit->second));
      const std::int64_t d = hit->second - hit->first;
      ASSERT_TRUE((d >= 0 && (!wa || d <= *wa - 1)) || (d <= 0 && (!wb || -d <= *wb - 1))) << "trial " << trial;
    }
  }
}

TEST(Overlap, HugeRangesAreDecidedWithoutEnumeration) {
  // Two interleaved progressions of a billion candidates each that never meet: windows of
  // 3 at multiples of 10 and at 5 mod 10.
  EXPECT_FALSE(firstWindowOverlap(range(10, 10000000000, 10), 3, range(5, 10000000005, 10), 3).has_value());
  // A window of 6 reaches the other progression.
  auto hit = firstWindowOverlap(range(10, 10000000000, 10), 6, range(5, 10000000005, 10), 3);
  ASSERT_TRUE(hit.has_value());
  // Co-prime steps meet only far out: 7 * i + 1 == 1000003 * j + 2 first at a large i.
  auto far = firstWindowOverlap(range(1, 7000000001, 7), 1, range(2, 1000003000002, 1000003), 1);
  ASSERT_TRUE(far.has_value());
  EXPECT_EQ(far->first, far->second);
  EXPECT_EQ((far->first - 1) % 7, 0);
  EXPECT_EQ((far->second - 2) % 1000003, 0);
}

TEST(Overlap, TargetKeysDecideWhichIncidentsAreCompared) {
  Json m = baseManifest();
  Json second = m["incidents"][0];
  second["incident_id"] = "later";
  second["trigger"] = Json{{"at", Json{15}}};
  second["lifetime"] = Json{{"until", "recovery"}};
  m["incidents"].push_back(second);
  const Campaign c = Campaign::parse(m.dump());
  // Different targets: fine. Same target: the permanent fault from 15 meets sdc@20.
  EXPECT_NO_THROW(checkTargetOverlaps(c, [](std::size_t i, std::size_t) { return "t" + std::to_string(i); }));
  try {
    checkTargetOverlaps(c, [](std::size_t, std::size_t) { return std::string("layers.2"); });
    FAIL() << "expected an overlap";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        e.message().find("incidents[1] (\"later\" at 15) can be active together with incidents[0] (\"sdc\" at 20)"),
        std::string::npos)
        << e.message();
  }
  // Probability zero never fires.
  m["incidents"][1]["trigger"]["probability"] = 0;
  EXPECT_NO_THROW(
      checkTargetOverlaps(Campaign::parse(m.dump()), [](std::size_t, std::size_t) { return std::string("x"); }));
  // Two actions of one incident on one target.
  Json twin = baseManifest();
  Json f = twin["incidents"][0]["faults"][0];
  f["fault_id"] = "alias";
  twin["incidents"][0]["faults"].push_back(f);
  EXPECT_THROW(
      checkTargetOverlaps(Campaign::parse(twin.dump()), [](std::size_t, std::size_t) { return std::string("x"); }),
      InvalidArgument);
}

}  // namespace
}  // namespace lmr::campaign
