#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "lmr/campaign/manifest.h"
#include "test_util.h"

namespace lmr::campaign {
namespace {

using json::Json;
using testing::baseManifest;
using testing::parseError;
using testing::readExample;

TEST(Manifest, SpecExampleParsesWithDefaults) {
  const Campaign c = Campaign::parse(readExample("mixed-production-failures.json"));
  EXPECT_EQ(c.name(), "mixed-production-failures");
  EXPECT_EQ(c.seed(), 17);
  ASSERT_EQ(c.incidents().size(), 2u);
  const Incident& sdc = c.incidents()[0];
  EXPECT_EQ(sdc.trigger.at, (std::vector<std::int64_t>{37, 203, 911}));
  EXPECT_EQ(sdc.temporalClass(), TemporalClass::kIntermittent);
  EXPECT_EQ(sdc.faults[0].target.expectedRank(), 3);
  const Incident& straggler = c.incidents()[1];
  EXPECT_TRUE(straggler.trigger.is_range);
  EXPECT_EQ(straggler.trigger.candidateCount(), 11u);
  EXPECT_EQ(straggler.trigger.lastCandidate(), 500);
  EXPECT_FALSE(isBuiltInEffect(straggler.faults[0].type, straggler.faults[0].target.surface));
  // A delay in the collective is a slow link: a communication straggler, not a computing one.
  EXPECT_EQ(expectedKind(straggler.faults[0].type, straggler.faults[0].target.surface), "comm_straggler");
  EXPECT_EQ(expectedKind(FailureType::kDelay, Surface::kCompute), "straggler");
  EXPECT_EQ(c.metadata()["topology"], "dp=8,tp=2");
  EXPECT_EQ(c.identity().rfind("sha256:", 0), 0u);
  EXPECT_EQ(c.identity().size(), 7u + 64u);
}

TEST(Manifest, AllExamplesParse) {
  for (const char* name :
       {"mixed-production-failures.json", "permanent-node-loss.json", "dense-sdc-qualification.json"}) {
    EXPECT_EQ(parseError(readExample(name)), "") << name;
  }
  const Campaign loss = Campaign::parse(readExample("permanent-node-loss.json"));
  EXPECT_EQ(loss.incidents()[0].temporalClass(), TemporalClass::kPermanent);
  EXPECT_EQ(loss.incidents()[0].faults[0].target.expectedRank(), std::nullopt);  // resource-only
  EXPECT_EQ(loss.incidents()[0].faults[0].target.executionRank(), 0);
}

TEST(Manifest, IdentityIgnoresKeyOrderWhitespaceAndSpelledOutDefaults) {
  const Campaign a = Campaign::parse(baseManifest().dump());
  Json spelled = baseManifest();
  spelled["schema_version"] = 1;
  spelled["seed"] = 0;
  spelled["clock"] = Json{{"type", "training_iteration"}, {"origin", "training_run"}};
  spelled["metadata"] = Json::object();
  spelled["incidents"][0]["retrigger"] = "once";
  spelled["incidents"][0]["trigger"]["probability"] = 1;
  spelled["incidents"][0]["faults"][0]["target"]["model_part"] = 0;
  const Campaign b = Campaign::parse(spelled.dump(4));
  EXPECT_EQ(a.identity(), b.identity());
  EXPECT_EQ(a.canonicalJson(), b.canonicalJson());
  // The canonical text parses back to itself.
  const Campaign c = Campaign::parse(a.canonicalJson());
  EXPECT_EQ(c.canonicalJson(), a.canonicalJson());
  EXPECT_EQ(Campaign::parse(a.toJson(2)).identity(), a.identity());
  // And any change of meaning changes the identity.
  Json edited = baseManifest();
  edited["incidents"][0]["trigger"]["at"] = Json{10, 21};
  EXPECT_NE(Campaign::parse(edited.dump()).identity(), a.identity());
  Json meta = baseManifest();
  meta["metadata"] = Json{{"ticket", "X-1"}};
  EXPECT_NE(Campaign::parse(meta.dump()).identity(), a.identity());
}

TEST(Manifest, CanonicalFormWritesDefaults) {
  const std::string canonical = Campaign::parse(baseManifest().dump()).canonicalJson();
  for (const char* piece : {"\"schema_version\":1", "\"seed\":0", "\"origin\":\"training_run\"", "\"probability\":1.0",
                            "\"retrigger\":\"once\"", "\"model_part\":0", "\"metadata\":{}"}) {
    EXPECT_NE(canonical.find(piece), std::string::npos) << piece << " in " << canonical;
  }
}

TEST(Manifest, SeedIsASigned128BitInteger) {
  const std::string max = "170141183460469231731687303715884105727";
  const std::string min = "-170141183460469231731687303715884105728";
  for (const std::string& seed : {max, min, std::string("18446744073709551615"), std::string("-5")}) {
    Json m = baseManifest();
    std::string text = m.dump();
    text.insert(1, "\"seed\": " + seed + ", ");
    const Campaign c = Campaign::parse(text);
    EXPECT_EQ(json::int128ToString(c.seed()), seed);
    EXPECT_NE(c.canonicalJson().find("\"seed\":" + seed + "}"), std::string::npos) << c.canonicalJson();
    EXPECT_EQ(Campaign::parse(c.canonicalJson()).seed(), c.seed());
  }
  for (const std::string& bad : {std::string("170141183460469231731687303715884105728"), std::string("1.0"),
                                 std::string("true"), std::string("\"17\""), std::string("1e3")}) {
    std::string text = baseManifest().dump();
    text.insert(1, "\"seed\": " + bad + ", ");
    EXPECT_EQ(parseError(text).rfind("seed: ", 0), 0u) << bad << ": " << parseError(text);
  }
}

struct BadCase {
  const char* what;
  std::function<void(Json&)> mutate;
  const char* path;  // the message must start with this
};

TEST(Manifest, ErrorsNameTheJsonPath) {
  const std::vector<BadCase> cases = {
      {"unknown top-level key", [](Json& m) { m["bogus"] = 1; }, "bogus: unknown field"},
      {"misspelled trigger field", [](Json& m) { m["incidents"][0]["trigger"]["att"] = Json{1}; },
       "incidents[0].trigger.att: unknown field"},
      {"rank boolean", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["rank"] = true; },
       "incidents[0].faults[0].target.rank: must be a JSON integer"},
      {"rank fractional", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["rank"] = 3.0; },
       "incidents[0].faults[0].target.rank: must be a JSON integer"},
      {"rank string", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["rank"] = "3"; },
       "incidents[0].faults[0].target.rank: must be a JSON integer"},
      {"rank negative", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["rank"] = -1; },
       "incidents[0].faults[0].target.rank: must be a non-negative"},
      {"rank and host", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["host"] = "node-b"; },
       "incidents[0].faults[0].target.rank: give \"rank\" or \"host\", not both"},
      {"local_rank without host", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["local_rank"] = 1; },
       "incidents[0].faults[0].target.local_rank: needs \"host\""},
      {"host empty",
       [](Json& m) {
         m["incidents"][0]["faults"][0]["target"].erase("rank");
         m["incidents"][0]["faults"][0]["target"]["host"] = " ";
       },
       "incidents[0].faults[0].target.host: must be a non-empty string"},
      {"at unsorted", [](Json& m) { m["incidents"][0]["trigger"]["at"] = Json{20, 10}; },
       "incidents[0].trigger.at[1]: must be sorted and unique"},
      {"at duplicate", [](Json& m) { m["incidents"][0]["trigger"]["at"] = Json{10, 10}; },
       "incidents[0].trigger.at[1]: must be sorted"},
      {"at zero", [](Json& m) { m["incidents"][0]["trigger"]["at"] = Json{0, 10}; },
       "incidents[0].trigger.at[0]: must be a positive integer"},
      {"at empty", [](Json& m) { m["incidents"][0]["trigger"]["at"] = Json::array(); },
       "incidents[0].trigger.at: must be a non-empty array"},
      {"at and range", [](Json& m) { m["incidents"][0]["trigger"]["range"] = Json{{"start", 1}, {"end", 5}}; },
       "incidents[0].trigger: needs exactly one"},
      {"range end before start",
       [](Json& m) { m["incidents"][0]["trigger"] = Json{{"range", Json{{"start", 9}, {"end", 5}}}}; },
       "incidents[0].trigger.range.end: must be >= start"},
      {"range every zero",
       [](Json& m) { m["incidents"][0]["trigger"] = Json{{"range", Json{{"start", 1}, {"end", 5}, {"every", 0}}}}; },
       "incidents[0].trigger.range.every: must be a positive"},
      {"range unknown key",
       [](Json& m) { m["incidents"][0]["trigger"] = Json{{"range", Json{{"start", 1}, {"stop", 5}}}}; },
       "incidents[0].trigger.range.stop: unknown field"},
      {"probability above one", [](Json& m) { m["incidents"][0]["trigger"]["probability"] = 1.5; },
       "incidents[0].trigger.probability: must be in [0, 1]"},
      {"probability boolean", [](Json& m) { m["incidents"][0]["trigger"]["probability"] = true; },
       "incidents[0].trigger.probability: must be a number"},
      {"two lifetimes", [](Json& m) { m["incidents"][0]["lifetime"]["iterations"] = 2; },
       "incidents[0].lifetime: needs exactly one"},
      {"until with two candidates", [](Json& m) { m["incidents"][0]["lifetime"] = Json{{"until", "recovery"}}; },
       "incidents[0].lifetime.until: a permanent lifetime needs exactly one"},
      {"until unknown",
       [](Json& m) {
         m["incidents"][0]["trigger"]["at"] = Json{5};
         m["incidents"][0]["lifetime"] = Json{{"until", "forever"}};
       },
       "incidents[0].lifetime.until: unknown value"},
      {"matching_calls on weight", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["surface"] = "weight"; },
       "incidents[0].lifetime.matching_calls: not valid for surface \"weight\""},
      {"multi-call with two candidates", [](Json& m) { m["incidents"][0]["lifetime"] = Json{{"matching_calls", 2}}; },
       "incidents[0].lifetime.matching_calls: more than one call"},
      {"overlapping windows (at)",
       [](Json& m) {
         m["incidents"][0]["trigger"]["at"] = Json{10, 12};
         m["incidents"][0]["lifetime"] = Json{{"iterations", 3}};
       },
       "incidents[0].lifetime.iterations: active windows of 3 iterations overlap"},
      {"overlapping windows (range)",
       [](Json& m) {
         m["incidents"][0]["trigger"] = Json{{"range", Json{{"start", 1}, {"end", 9}, {"every", 2}}}};
         m["incidents"][0]["lifetime"] = Json{{"iterations", 3}};
       },
       "incidents[0].lifetime.iterations: active windows"},
      {"zero lifetime", [](Json& m) { m["incidents"][0]["lifetime"] = Json{{"iterations", 0}}; },
       "incidents[0].lifetime.iterations: must be a positive"},
      {"duplicate incident", [](Json& m) { m["incidents"].push_back(m["incidents"][0]); },
       "incidents[1].incident_id: duplicate incident_id \"sdc\""},
      {"duplicate fault", [](Json& m) { m["incidents"][0]["faults"].push_back(m["incidents"][0]["faults"][0]); },
       "incidents[0].faults[1].fault_id: duplicate fault_id"},
      {"empty name", [](Json& m) { m["name"] = ""; }, "name: must be a non-empty string"},
      {"blank name", [](Json& m) { m["name"] = "  "; }, "name: must be a non-empty string"},
      {"numeric name", [](Json& m) { m["name"] = 7; }, "name: must be a string"},
      {"numeric incident id", [](Json& m) { m["incidents"][0]["incident_id"] = 7; },
       "incidents[0].incident_id: must be a string"},
      {"null fault id", [](Json& m) { m["incidents"][0]["faults"][0]["fault_id"] = nullptr; },
       "incidents[0].faults[0].fault_id: must be a string"},
      {"missing name", [](Json& m) { m.erase("name"); }, "name: required field is missing"},
      {"no incidents", [](Json& m) { m["incidents"] = Json::array(); }, "incidents: must be a non-empty array"},
      {"no faults", [](Json& m) { m["incidents"][0]["faults"] = Json::array(); },
       "incidents[0].faults: must be a non-empty array"},
      {"schema version 2", [](Json& m) { m["schema_version"] = 2; }, "schema_version: unsupported version 2"},
      {"clock origin", [](Json& m) { m["clock"] = Json{{"origin", "wall_clock"}}; }, "clock.origin: unknown value"},
      {"clock type", [](Json& m) { m["clock"] = Json{{"type", "forward_call"}}; }, "clock.type: unknown value"},
      {"max_occurrences missing", [](Json& m) { m["incidents"][0]["retrigger"] = "max_occurrences"; },
       "incidents[0].max_occurrences: required"},
      {"max_occurrences with once", [](Json& m) { m["incidents"][0]["max_occurrences"] = 2; },
       "incidents[0].max_occurrences: only valid"},
      {"retrigger unknown", [](Json& m) { m["incidents"][0]["retrigger"] = "always"; },
       "incidents[0].retrigger: unknown value"},
      {"unknown type", [](Json& m) { m["incidents"][0]["faults"][0]["type"] = "bitrot"; },
       "incidents[0].faults[0].type: unknown value"},
      {"unknown surface", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["surface"] = "activations"; },
       "incidents[0].faults[0].target.surface: unknown value"},
      {"module surface without module",
       [](Json& m) {
         auto& t = m["incidents"][0]["faults"][0]["target"];
         t.erase("component");
         t.erase("index");
       },
       "incidents[0].faults[0].target: surface \"output\" names a module"},
      {"indexed component without index", [](Json& m) { m["incidents"][0]["faults"][0]["target"].erase("index"); },
       "incidents[0].faults[0].target.index: required for component"},
      {"embedding with index", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["component"] = "embedding"; },
       "incidents[0].faults[0].target.index: component \"embedding\" is not indexed"},
      {"unknown component, built-in",
       [](Json& m) {
         auto& t = m["incidents"][0]["faults"][0]["target"];
         t["component"] = "router";
         t.erase("index");
       },
       "incidents[0].faults[0].target.component: the built-in resolver"},
      {"blank module_path", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["module_path"] = " "; },
       "incidents[0].faults[0].target.module_path: must be a non-empty string"},
      {"numeric operation selector", [](Json& m) { m["incidents"][0]["faults"][0]["target"]["operation"] = 3; },
       "incidents[0].faults[0].target.operation: must be a string"},
      {"target metadata not an object",
       [](Json& m) { m["incidents"][0]["faults"][0]["target"]["metadata"] = Json::array(); },
       "incidents[0].faults[0].target.metadata: must be an object"},
      {"campaign metadata not an object", [](Json& m) { m["metadata"] = "x"; }, "metadata: must be an object"},
      {"missing operation", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"] = Json::object(); },
       "incidents[0].faults[0].parameters.operation: required"},
      {"unknown operation", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["operation"] = "zap"; },
       "incidents[0].faults[0].parameters.operation: unknown value"},
      {"unknown parameter", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["strength"] = 2; },
       "incidents[0].faults[0].parameters.strength: does not apply"},
      {"factor on bit flip", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["factor"] = 2; },
       "incidents[0].faults[0].parameters.factor: does not apply"},
      {"magnitude on sign flip",
       [](Json& m) {
         m["incidents"][0]["faults"][0]["parameters"] = Json{{"operation", "sign_flip"}, {"magnitude", "large"}};
       },
       "incidents[0].faults[0].parameters.magnitude: does not apply"},
      {"bad scope", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["scope"] = "5%"; },
       "incidents[0].faults[0].parameters.scope: unknown value"},
      {"bad magnitude", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["magnitude"] = "huge"; },
       "incidents[0].faults[0].parameters.magnitude: unknown value"},
      {"set_value without value",
       [](Json& m) { m["incidents"][0]["faults"][0]["parameters"] = Json{{"operation", "set_value"}}; },
       "incidents[0].faults[0].parameters.value: required"},
      {"set_value NaN spelling",
       [](Json& m) {
         m["incidents"][0]["faults"][0]["parameters"] = Json{{"operation", "set_value"}, {"value", "NaN"}};
       },
       "incidents[0].faults[0].parameters.value: a string value must be"},
      {"set_value boolean",
       [](Json& m) {
         m["incidents"][0]["faults"][0]["parameters"] = Json{{"operation", "set_value"}, {"value", true}};
       },
       "incidents[0].faults[0].parameters.value: must be a number"},
      {"scale by one",
       [](Json& m) { m["incidents"][0]["faults"][0]["parameters"] = Json{{"operation", "scale"}, {"factor", 1}}; },
       "incidents[0].faults[0].parameters.factor: 1 would change nothing"},
      {"noise std zero",
       [](Json& m) { m["incidents"][0]["faults"][0]["parameters"] = Json{{"operation", "noise"}, {"std", 0}}; },
       "incidents[0].faults[0].parameters.std: must be positive"},
      {"state_key on output", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["state_key"] = "exp_avg"; },
       "incidents[0].faults[0].parameters.state_key: does not apply"},
      {"parameter on output", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["parameter"] = "weight"; },
       "incidents[0].faults[0].parameters.parameter: does not apply"},
      {"point on output", [](Json& m) { m["incidents"][0]["faults"][0]["parameters"]["point"] = "local"; },
       "incidents[0].faults[0].parameters.point: does not apply"},
      {"unknown gradient point",
       [](Json& m) {
         m["incidents"][0]["faults"][0]["target"]["surface"] = "gradient";
         m["incidents"][0]["faults"][0]["parameters"]["point"] = "after_allreduce";
       },
       "incidents[0].faults[0].parameters.point: unknown value \"after_allreduce\" (allowed: local, reduced)"},
      {"reorder with scope",
       [](Json& m) {
         m["incidents"][0]["faults"][0]["type"] = "reorder";
         m["incidents"][0]["faults"][0]["parameters"] = Json{{"scope", "row"}};
       },
       "incidents[0].faults[0].parameters.scope: does not apply"},
      {"non-finite bounded weight fault",
       [](Json& m) {
         auto& inc = m["incidents"][0];
         inc["lifetime"] = Json{{"iterations", 1}};
         inc["faults"][0]["target"]["surface"] = "weight";
         inc["faults"][0]["parameters"] = Json{{"operation", "set_value"}, {"value", "nan"}};
       },
       "incidents[0].faults[0].parameters.value: a non-finite value on surface \"weight\""},
      {"delay without delay_ms",
       [](Json& m) {
         auto& f = m["incidents"][0]["faults"][0];
         f["type"] = "delay";
         f["target"]["surface"] = "compute";
         f["parameters"] = Json::object();
       },
       "incidents[0].faults[0].parameters.delay_ms: required"},
      {"delay_ms string",
       [](Json& m) {
         auto& f = m["incidents"][0]["faults"][0];
         f["type"] = "delay";
         f["target"]["surface"] = "compute";
         f["parameters"] = Json{{"delay_ms", "500"}};
       },
       "incidents[0].faults[0].parameters.delay_ms: must be a number"},
      {"delay_ms boolean",
       [](Json& m) {
         auto& f = m["incidents"][0]["faults"][0];
         f["type"] = "delay";
         f["target"]["surface"] = "compute";
         f["parameters"] = Json{{"delay_ms", true}};
       },
       "incidents[0].faults[0].parameters.delay_ms: must be a number"},
      {"delay_ms negative",
       [](Json& m) {
         auto& f = m["incidents"][0]["faults"][0];
         f["type"] = "delay";
         f["target"]["surface"] = "compute";
         f["parameters"] = Json{{"delay_ms", -5}};
       },
       "incidents[0].faults[0].parameters.delay_ms: must be positive"},
      {"delay_ms too long",
       [](Json& m) {
         auto& f = m["incidents"][0]["faults"][0];
         f["type"] = "delay";
         f["target"]["surface"] = "compute";
         f["parameters"] = Json{{"delay_ms", 1e300}};
       },
       "incidents[0].faults[0].parameters.delay_ms: exceeds"},
  };
  for (const BadCase& c : cases) {
    Json m = baseManifest();
    c.mutate(m);
    const std::string error = parseError(m.dump());
    EXPECT_EQ(error.rfind(c.path, 0), 0u) << c.what << "\n  got: " << error << "\n  want prefix: " << c.path;
  }
}

TEST(Manifest, StrictJsonSyntax) {
  EXPECT_EQ(parseError(R"({"name": "a", "name": "b", "incidents": []})").rfind("name: duplicate key", 0), 0u);
  EXPECT_NE(parseError(R"({"name": "a", "seed": NaN})").find("campaign: byte"), std::string::npos);
  EXPECT_NE(parseError(R"({"name": "a", "seed": 1e999})").find("overflow"), std::string::npos);
  EXPECT_NE(parseError("{\"name\": \"a\"} {}").find("campaign: byte"), std::string::npos);
  EXPECT_EQ(parseError("[]").rfind("(document): must be an object", 0), 0u);
  EXPECT_NE(parseError("{\"name\": \"\xff\"}").find("UTF-8"), std::string::npos);
}

TEST(Manifest, ExecutorParametersAndMetadataAreFreeButFinite) {
  Json m = baseManifest();
  auto& f = m["incidents"][0]["faults"][0];
  f["type"] = "process_termination";
  f["target"] =
      Json{{"surface", "process"}, {"rank", 4}, {"metadata", Json{{"host", "n7"}, {"nested", Json{1, 2.5, nullptr}}}}};
  f["parameters"] = Json{{"signal", "SIGKILL"}, {"grace_s", 2.5}, {"anything", Json{{"deep", Json::array()}}}};
  EXPECT_EQ(parseError(m.dump()), "");
  const Campaign c = Campaign::parse(m.dump());
  EXPECT_EQ(c.incidents()[0].faults[0].parameters["signal"], "SIGKILL");
  EXPECT_EQ(requiredSafety(FailureType::kProcessTermination, Surface::kProcess), SafetyClass::kIsolatedDestructive);
  EXPECT_EQ(requiredSafety(FailureType::kNetworkPartition, Surface::kResource), SafetyClass::kClusterDestructive);
}

TEST(Manifest, ValidBuiltInParameterCombinations) {
  const std::vector<Json> params = {
      Json{{"operation", "single_bitflip"}, {"magnitude", "near_invisible"}, {"scope", "single"}},
      Json{{"operation", "multi_bitflip"}, {"scope", "100%"}},
      Json{{"operation", "set_value"}, {"value", "-inf"}, {"scope", "row"}},
      Json{{"operation", "set_value"}, {"value", 0.5}},
      Json{{"operation", "scale"}, {"factor", -2}, {"magnitude", "large"}},
      Json{{"operation", "noise"}, {"std", 1e-3}, {"scope", "10%"}},
      Json{{"operation", "sign_flip"}, {"scope", "1%"}},
  };
  for (const Json& p : params) {
    Json m = baseManifest();
    m["incidents"][0]["faults"][0]["parameters"] = p;
    EXPECT_EQ(parseError(m.dump()), "") << p.dump();
  }
  Json m = baseManifest();
  auto& inc = m["incidents"][0];
  inc["lifetime"] = Json{{"iterations", 2}};
  inc["faults"][0]["target"]["surface"] = "optimizer_state";
  inc["faults"][0]["parameters"] =
      Json{{"operation", "scale"}, {"factor", 4}, {"state_key", "exp_avg_sq"}, {"parameter", "weight"}};
  EXPECT_EQ(parseError(m.dump()), "");
  for (const char* point : {"local", "reduced"}) {
    inc["faults"][0]["target"]["surface"] = "gradient";
    inc["faults"][0]["parameters"] = Json{{"operation", "sign_flip"}, {"point", point}, {"parameter", "weight"}};
    EXPECT_EQ(parseError(m.dump()), "") << point;
  }
}

TEST(Manifest, TemporalClasses) {
  Json m = baseManifest();
  m["incidents"][0]["trigger"]["at"] = Json{7};
  EXPECT_EQ(Campaign::parse(m.dump()).incidents()[0].temporalClass(), TemporalClass::kTransient);
  m["incidents"][0]["trigger"]["probability"] = 0.5;
  EXPECT_EQ(Campaign::parse(m.dump()).incidents()[0].temporalClass(), TemporalClass::kIntermittent);
  m["incidents"][0]["lifetime"] = Json{{"until", "campaign_end"}};
  EXPECT_EQ(Campaign::parse(m.dump()).incidents()[0].temporalClass(), TemporalClass::kPermanent);
}

}  // namespace
}  // namespace lmr::campaign
