#include <gtest/gtest.h>

#include <string>

#include "lmr/common/error.h"
#include "lmr/oob/report.h"

namespace lmr::oob {
namespace {

using Json = nlohmann::json;

// A report as lmr-oobd writes it.
Json written() {
  FaultReport fault{report_kind::kCollectiveDesync, kScopeRank, {2}, {"node-1"}, {}, Json::array({{{"rank", 2}}})};
  ScoutFaultReport r = ScoutFaultReport::of(fault);
  r.report_id = "scout-fault-ab-g0-r0";
  r.run_id = "job";
  r.round = 0;
  r.step = 12;
  r.peer_group = "world";
  r.group_ranks = {0, 1, 2, 3};
  r.threshold_s = 30;
  r.detection_latency_s = 31.5;
  r.written_by = 0;
  return toJson(r);
}

// The message of the InvalidArgument that parsing `document` throws ("" when it parses).
std::string parseError(const Json& document) {
  try {
    parseReport(document);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Report, RoundTripsWhatTheDaemonWrites) {
  const Json j = written();
  const ScoutFaultReport r = parseReport(j);
  EXPECT_EQ(r.kind, "collective_desync");
  EXPECT_EQ(r.ranks, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(r.step, 12);
  EXPECT_EQ(r.evidence[0]["rank"], 2);
  EXPECT_EQ(toJson(r), j);
  EXPECT_EQ(parseReport(j.dump(2), "r.json"), r);
}

TEST(Report, OnlyKindScopeRanksAndHostsAreRequired) {
  const ScoutFaultReport r =
      parseReport(Json{{"kind", "process_stall"}, {"scope", "rank"}, {"ranks", {1}}, {"hosts", {"h"}}});
  EXPECT_EQ(r.generation, 0);
  EXPECT_TRUE(r.evidence.is_null());
  EXPECT_FALSE(r.step.has_value());
  EXPECT_FALSE(r.detection_latency_s.has_value());
  Json nulls = written();
  nulls["step"] = nullptr;
  nulls["threshold_s"] = nullptr;
  EXPECT_FALSE(parseReport(nulls).step.has_value());
}

TEST(Report, MissingRequiredKeysAreNamed) {
  for (const char* key : {"kind", "scope", "ranks", "hosts"}) {
    Json j = written();
    j.erase(key);
    EXPECT_EQ(parseError(j).rfind(std::string(key) + ": required field is missing", 0), 0u) << parseError(j);
  }
}

TEST(Report, UnknownKeysAreRejected) {
  Json j = written();
  j["rank"] = 3;
  EXPECT_EQ(parseError(j).rfind("rank: unknown field", 0), 0u) << parseError(j);
}

TEST(Report, WrongTypesNameTheirPath) {
  auto with = [](const char* key, Json value) {
    Json j = written();
    j[key] = std::move(value);
    return parseError(j);
  };
  EXPECT_EQ(with("ranks", 1).rfind("ranks: must be an array of integers", 0), 0u);
  EXPECT_EQ(with("ranks", {0, "1"}).rfind("ranks[1]: must be a JSON integer", 0), 0u);
  EXPECT_EQ(with("ranks", {0, 1.5}).rfind("ranks[1]: must be a JSON integer", 0), 0u);
  EXPECT_EQ(with("hosts", {"a", 3}).rfind("hosts[1]: must be a string", 0), 0u) << with("hosts", {"a", 3});
  EXPECT_EQ(with("group_ranks", {true}).rfind("group_ranks[0]: must be a JSON integer", 0), 0u);
  EXPECT_EQ(with("missing_ranks", "3").rfind("missing_ranks: must be an array", 0), 0u);
  EXPECT_EQ(with("step", "12").rfind("step: must be a JSON integer", 0), 0u);
  EXPECT_EQ(with("generation", -1).rfind("generation:", 0), 0u);
  EXPECT_EQ(with("detection_latency_s", "1").rfind("detection_latency_s: must be a number", 0), 0u);
  EXPECT_EQ(with("run_id", 5).rfind("run_id: must be a string", 0), 0u);
  EXPECT_EQ(with("kind", 5).rfind("kind: must be a string", 0), 0u);
  EXPECT_EQ(parseError(Json::array()).rfind("(document): must be an object", 0), 0u);
}

TEST(Report, BadKindsScopesTypesAndVersionsAreRejected) {
  auto with = [](const char* key, Json value) {
    Json j = written();
    j[key] = std::move(value);
    return parseError(j);
  };
  EXPECT_EQ(with("kind", "weird").rfind("kind: unknown report kind \"weird\"", 0), 0u);
  EXPECT_EQ(with("scope", "node").rfind("scope: must be \"rank\" or \"peer_group\"", 0), 0u);
  EXPECT_EQ(with("type", "lmr.health_event").rfind("type: not a SCOUTFaultReport", 0), 0u);
  EXPECT_EQ(with("schema_version", 2).rfind("schema_version: unsupported version 2", 0), 0u);
}

TEST(Report, SyntaxErrorsNameTheSource) {
  try {
    parseReport(std::string_view("{\"kind\": "), "scout-fault-r0.json");
    FAIL() << "parsed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("scout-fault-r0.json"), std::string::npos) << e.what();
  }
}

TEST(Report, EveryKindHasAKitKind) {
  for (const ReportKind& k : reportKinds()) {
    if (std::string(k.name) == report_kind::kDaemonFailure) EXPECT_FALSE(k.kit_kind.has_value());
    else EXPECT_EQ(k.kit_kind, "hang") << k.name;
  }
  EXPECT_EQ(reportKinds().size(), 8u);
}

}  // namespace
}  // namespace lmr::oob
