// health::Rules: every fatal and warning rule, emit-once and rate limiting.
#include <gtest/gtest.h>

#include "lmr/common/error.h"
#include "lmr/health/monitor.h"

namespace lmr::health {
namespace {

DeviceInfo gpu(int index) { return DeviceInfo{index, "GPU-" + std::to_string(index), "00000000:18:00.0", "test"}; }

Reading reading(const char* metric, double value, int device = 0) { return Reading{gpu(device), metric, value, ""}; }

std::vector<Event> run(Rules& rules, std::vector<Reading> readings, double now = 1000) {
  return rules.evaluate("test", readings, now);
}

TEST(HealthRules, UncorrectableEccGrowthIsFatalOncePerDevice) {
  Rules rules{MonitorOptions{}};
  EXPECT_TRUE(
      run(rules, {reading(metric::kEccUncorrectableVolatile, 0), reading(metric::kEccUncorrectableAggregate, 2)})
          .empty());
  auto events =
      run(rules, {reading(metric::kEccUncorrectableVolatile, 1), reading(metric::kEccUncorrectableAggregate, 3)});
  ASSERT_EQ(events.size(), 1u);  // both counters grew: one event for the family
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].metric, event_metric::kEccUncorrectable);
  EXPECT_EQ(events[0].value, 1);
  EXPECT_EQ(events[0].threshold, 0);
  EXPECT_EQ(events[0].device.uuid, "GPU-0");
  EXPECT_TRUE(run(rules, {reading(metric::kEccUncorrectableVolatile, 5)}).empty());  // emitted once
  // Another device is its own (device, metric).
  EXPECT_TRUE(run(rules, {reading(metric::kEccUncorrectableVolatile, 0, 1)}).empty());
  EXPECT_EQ(run(rules, {reading(metric::kEccUncorrectableVolatile, 1, 1)}).size(), 1u);
}

TEST(HealthRules, UncorrectableEccPresentAtStartIsAWarning) {
  Rules rules{MonitorOptions{}};
  auto events = run(rules, {reading(metric::kEccUncorrectableVolatile, 2)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  events = run(rules, {reading(metric::kEccUncorrectableVolatile, 3)}, 1001);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);  // growth after start is still fatal
}

TEST(HealthRules, CounterResetIsANewBaseline) {
  Rules rules{MonitorOptions{}};
  run(rules, {reading(metric::kEccUncorrectableAggregate, 9)});
  EXPECT_TRUE(run(rules, {reading(metric::kEccUncorrectableAggregate, 0)}).empty());
  EXPECT_EQ(run(rules, {reading(metric::kEccUncorrectableAggregate, 1)}).size(), 1u);
}

TEST(HealthRules, CorrectableEccWarningsAreRateLimited) {
  MonitorOptions options;
  options.warning_interval_s = 60;
  Rules rules{options};
  run(rules, {reading(metric::kEccCorrectableVolatile, 0)}, 0);
  auto first = run(rules, {reading(metric::kEccCorrectableVolatile, 4)}, 10);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].severity, Severity::kWarning);
  EXPECT_EQ(first[0].metric, event_metric::kEccCorrectable);
  EXPECT_TRUE(run(rules, {reading(metric::kEccCorrectableVolatile, 8)}, 30).empty());
  EXPECT_EQ(run(rules, {reading(metric::kEccCorrectableVolatile, 9)}, 71).size(), 1u);
}

TEST(HealthRules, RowRemapFailureIsFatalPendingIsAWarning) {
  Rules rules{MonitorOptions{}};
  auto events = run(rules, {reading(metric::kRemapPending, 1), reading(metric::kRemapFailure, 0)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].metric, event_metric::kRemapPending);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  events = run(rules, {reading(metric::kRemapFailure, 1)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].metric, event_metric::kRemapFailure);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_TRUE(run(rules, {reading(metric::kRemapFailure, 1)}).empty());
}

TEST(HealthRules, DeviceLossIsFatal) {
  Rules rules{MonitorOptions{}};
  EXPECT_TRUE(run(rules, {reading(metric::kDeviceLost, 0)}).empty());
  Reading lost = reading(metric::kDeviceLost, 1);
  lost.detail = "GPU is lost";
  auto events = run(rules, {lost});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].message, "GPU is lost");
}

TEST(HealthRules, ConfiguredXidsAreFatalOthersWarn) {
  Rules rules{MonitorOptions{}};
  auto events = run(rules, {reading(metric::kXid, 13), reading(metric::kXid, 31)});
  ASSERT_EQ(events.size(), 2u);  // different XIDs are rate-limited separately
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  events = run(rules, {reading(metric::kXid, 79)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].value, 79);

  MonitorOptions options;
  options.fatal_xids = {13};
  Rules custom{options};
  events = run(custom, {reading(metric::kXid, 79), reading(metric::kXid, 13), reading(metric::kXid, 13)});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  EXPECT_EQ(events[1].severity, Severity::kFatal);
  EXPECT_EQ(events[1].value, 13);  // the second XID 13 is not repeated
}

TEST(HealthRules, EachFatalXidIsItsOwnEvent) {
  Rules rules{MonitorOptions{}};
  auto events = run(rules, {reading(metric::kXid, 119), reading(metric::kXid, 79), reading(metric::kXid, 119)});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].value, 119);
  EXPECT_EQ(events[1].value, 79);
  EXPECT_EQ(events[1].severity, Severity::kFatal);
}

TEST(HealthRules, DefaultFatalXids) {
  EXPECT_EQ(MonitorOptions{}.fatal_xids, (std::set<std::int64_t>{48, 74, 79, 95, 119, 120, 140}));
}

TEST(HealthRules, NvlinkGrowthWarnsThenIsFatalOverTheThreshold) {
  MonitorOptions options;
  options.nvlink_error_threshold = 100;
  options.nvlink_window_s = 60;
  Rules rules{options};
  auto nvlink = [](double crc, double replay, double recovery) {
    return std::vector<Reading>{reading(metric::kNvlinkCrc, crc), reading(metric::kNvlinkReplay, replay),
                                reading(metric::kNvlinkRecovery, recovery)};
  };
  EXPECT_TRUE(run(rules, nvlink(1000, 0, 0), 0).empty());  // baseline: old errors are not news
  auto events = run(rules, nvlink(1040, 5, 5), 10);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  EXPECT_EQ(events[0].value, 50);
  events = run(rules, nvlink(1080, 10, 11), 20);  // 101 over the window, 51 this poll
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].metric, event_metric::kNvlinkErrors);
  EXPECT_EQ(events[0].value, 101);
  EXPECT_EQ(events[0].threshold, 100);
}

TEST(HealthRules, NvlinkCountersResetOrMissingOnTheirOwn) {
  Rules rules{MonitorOptions{}};
  run(rules, {reading(metric::kNvlinkCrc, 500), reading(metric::kNvlinkReplay, 70)}, 0);
  // The replay counter missing for a poll is not a reset; back again, only its growth counts.
  EXPECT_TRUE(run(rules, {reading(metric::kNvlinkCrc, 500)}, 1).empty());
  auto events = run(rules, {reading(metric::kNvlinkCrc, 500), reading(metric::kNvlinkReplay, 75)}, 2);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].value, 5);
  // One counter reset (driver reload) becomes its baseline; the other's growth still counts.
  MonitorOptions options;
  options.warning_interval_s = 0;
  Rules fresh{options};
  run(fresh, {reading(metric::kNvlinkCrc, 500), reading(metric::kNvlinkReplay, 70)}, 0);
  events = run(fresh, {reading(metric::kNvlinkCrc, 3), reading(metric::kNvlinkReplay, 72)}, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].value, 2);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
}

TEST(HealthRules, SlowNvlinkGrowthOutsideTheWindowIsNotFatal) {
  MonitorOptions options;
  options.warning_interval_s = 0;
  Rules rules{options};
  double total = 0;
  for (int t = 0; t <= 600; t += 30) {
    auto events = run(rules, {reading(metric::kNvlinkCrc, total)}, t);
    for (const Event& e : events) EXPECT_EQ(e.severity, Severity::kWarning);
    total += 40;  // 80 per 60 s window: under the threshold of 100
  }
}

TEST(HealthRules, TemperatureNearShutdownIsFatalAtSlowdownWarns) {
  Rules rules{MonitorOptions{}};
  EXPECT_TRUE(run(rules, {reading(metric::kTemperature, 95)}).empty());  // no limits known: no rule
  auto events = run(rules, {reading(metric::kTemperature, 89), reading(metric::kTemperatureShutdown, 95),
                            reading(metric::kTemperatureSlowdown, 88)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  EXPECT_EQ(events[0].threshold, 88);
  events = run(rules, {reading(metric::kTemperature, 90)});  // limits remembered; 95 - 5 margin
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].threshold, 90);
}

TEST(HealthRules, TemperatureFatalNeverBelowTheSlowdownLimit) {
  Rules rules{MonitorOptions{}};  // limits 3 degrees apart, as some GPUs report
  EXPECT_TRUE(run(rules, {reading(metric::kTemperatureShutdown, 92), reading(metric::kTemperatureSlowdown, 89),
                          reading(metric::kTemperature, 88)})
                  .empty());
  auto events = run(rules, {reading(metric::kTemperature, 89)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  events = run(rules, {reading(metric::kTemperature, 90)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].threshold, 90);
}

TEST(HealthRules, TemperatureWarningWithoutSlowdownLimit) {
  Rules rules{MonitorOptions{}};
  EXPECT_TRUE(run(rules, {reading(metric::kTemperatureShutdown, 100), reading(metric::kTemperature, 84)}).empty());
  EXPECT_EQ(run(rules, {reading(metric::kTemperature, 85)}).size(), 1u);
}

TEST(HealthRules, RecoveryActionAndLinkDown) {
  Rules rules{MonitorOptions{}};
  EXPECT_TRUE(run(rules, {reading(metric::kRecoveryAction, 0), reading(metric::kNvlinkLinksActive, 18)}).empty());
  auto events = run(rules, {reading(metric::kRecoveryAction, 3), reading(metric::kNvlinkLinksActive, 17)});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  EXPECT_EQ(events[1].metric, event_metric::kNvlinkLinkDown);
  EXPECT_EQ(events[1].threshold, 18);
  events = run(rules, {reading(metric::kRecoveryAction, 1)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
}

TEST(HealthRules, UnknownMetricsRaiseNothing) {
  Rules rules{MonitorOptions{}};
  EXPECT_TRUE(run(rules, {reading("pcie_replay_count", 1e6), reading("pcie_replay_count", 2e6)}).empty());
}

TEST(HealthRules, OptionsAreValidated) {
  MonitorOptions options;
  options.interval_s = 0;
  try {
    Rules rules{options};
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.message()).find("interval_s"), std::string::npos);
  }
  options = MonitorOptions{};
  options.fatal_xids = {-1};
  EXPECT_THROW(Rules{options}, InvalidArgument);
  options = MonitorOptions{};
  options.temperature_margin_c = std::nan("");
  EXPECT_THROW(Rules{options}, InvalidArgument);
}

TEST(HealthRules, EventJson) {
  Rules rules{MonitorOptions{}};
  auto events = run(rules, {reading(metric::kRemapFailure, 1)}, 1234.5);
  ASSERT_EQ(events.size(), 1u);
  const nlohmann::json j = toJson(events[0]);
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["type"], "lmr.health_event");
  EXPECT_EQ(j["severity"], "fatal");
  EXPECT_EQ(j["metric"], "remap_failure");
  EXPECT_EQ(j["device"]["uuid"], "GPU-0");
  EXPECT_EQ(j["device"]["pci_bus_id"], "00000000:18:00.0");
  EXPECT_EQ(j["time"], 1234.5);
  EXPECT_EQ(j["source"], "test");
  EXPECT_FALSE(j["host"].get<std::string>().empty());
}

}  // namespace
}  // namespace lmr::health
