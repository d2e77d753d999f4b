// The health event document's strict reader, the vocabulary lists and the kit mapping.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "lmr/common/error.h"
#include "lmr/health/monitor.h"

namespace lmr::health {
namespace {

using Json = nlohmann::json;

Event lost() {
  Event e;
  e.device = DeviceInfo{3, "GPU-3", "00000000:1B:00.0", "test"};
  e.source = "nvml:3";
  e.host = "node-7";
  e.metric = event_metric::kDeviceLost;
  e.value = 1;
  e.threshold = 0;
  e.severity = Severity::kFatal;
  e.time_s = 1764590000.125;
  e.message = "GPU is lost";
  return e;
}

std::string parseError(const Json& document) {
  try {
    parseEvent(document);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(HealthEvent, RoundTripsThroughItsDocument) {
  const Event e = lost();
  EXPECT_EQ(parseEvent(toJson(e)), e);
  EXPECT_EQ(parseEvent(Json::parse(toJson(e).dump())), e);
  Event warning = e;
  warning.severity = Severity::kWarning;
  warning.value = 2.5;
  EXPECT_EQ(parseEvent(toJson(warning)), warning);
}

TEST(HealthEvent, StrictReaderNamesThePath) {
  auto with = [](const std::string& key, Json value) {
    Json j = toJson(lost());
    j[Json::json_pointer(key)] = std::move(value);
    return parseError(j);
  };
  EXPECT_EQ(with("/type", "lmr.scout_fault_report").rfind("type: not a health event", 0), 0u);
  EXPECT_EQ(with("/schema_version", 2).rfind("schema_version: unsupported version 2", 0), 0u);
  EXPECT_EQ(with("/severity", "bad").rfind("severity: must be \"fatal\" or \"warning\"", 0), 0u);
  EXPECT_EQ(with("/value", "1").rfind("value: must be a number", 0), 0u);
  EXPECT_EQ(with("/device/index", 1.5).rfind("device.index: must be a JSON integer", 0), 0u);
  EXPECT_EQ(with("/device/uuid", 3).rfind("device.uuid: must be a string", 0), 0u);
  EXPECT_EQ(with("/device/slot", 3).rfind("device.slot: unknown field", 0), 0u);
  EXPECT_EQ(with("/extra", 3).rfind("extra: unknown field", 0), 0u);
  Json j = toJson(lost());
  j.erase("message");
  EXPECT_EQ(parseError(j).rfind("message: required field is missing", 0), 0u);
  j = toJson(lost());
  j["device"].erase("index");
  EXPECT_EQ(parseError(j).rfind("device.index: required field is missing", 0), 0u);
  j = toJson(lost());
  j.erase("schema_version");
  EXPECT_EQ(parseError(j), "");  // optional: version 1
}

TEST(HealthEvent, ResourceNameAndKitKind) {
  Event e = lost();
  EXPECT_EQ(resourceName(e), "node-7/gpu-3");
  EXPECT_EQ(kitKind(e), "resource_unavailable");
  e.metric = event_metric::kXid;
  EXPECT_EQ(kitKind(e), std::nullopt);
}

TEST(HealthVocabulary, ListsAreCompleteAndDistinct) {
  const std::set<std::string> metrics(metricNames().begin(), metricNames().end());
  EXPECT_EQ(metrics.size(), metricNames().size());
  EXPECT_EQ(metrics.size(), 21u);
  for (const char* m : {metric::kEccUncorrectableVolatile, metric::kNvlinkCrcData, metric::kTemperatureSlowdown,
                        metric::kRecoveryAction, metric::kDeviceLost, metric::kXid})
    EXPECT_TRUE(metrics.count(m)) << m;
  const std::set<std::string> events(eventMetricNames().begin(), eventMetricNames().end());
  EXPECT_EQ(events.size(), 11u);
  EXPECT_TRUE(events.count(event_metric::kNvlinkLinkDown));
  EXPECT_EQ(severityFromName("fatal"), Severity::kFatal);
}

}  // namespace
}  // namespace lmr::health
