// health::Monitor: the polling thread, callbacks, stored errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "lmr/common/error.h"
#include "lmr/health/monitor.h"

namespace lmr::health {
namespace {

// Replays scripted polls; after the script, repeats the last one.
class ScriptedSource : public Source {
 public:
  explicit ScriptedSource(std::vector<std::vector<Reading>> script, std::string name = "scripted")
      : script_(std::move(script)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  PollResult poll() override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t i = std::min(calls_++, script_.size() - 1);
    return PollResult{script_[i], {}};
  }
  std::size_t calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::vector<Reading>> script_;
  std::string name_;
  std::size_t calls_ = 0;
};

class ThrowingSource : public Source {
 public:
  std::string name() const override { return "broken"; }
  PollResult poll() override { throw IoError("sensor bus unreadable"); }
};

Reading sensorReading(const char* metric, double value) {
  return Reading{DeviceInfo{0, "GPU-x", "", ""}, metric, value, ""};
}

bool waitFor(const std::function<bool()>& done, double seconds = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

TEST(HealthMonitor, ThreadPollsAndDeliversEachFatalOnce) {
  auto source = std::make_shared<ScriptedSource>(std::vector<std::vector<Reading>>{
      {sensorReading(metric::kEccUncorrectableVolatile, 0)},
      {sensorReading(metric::kEccUncorrectableVolatile, 0)},
      {sensorReading(metric::kEccUncorrectableVolatile, 2), sensorReading(metric::kRemapFailure, 1)},
  });
  MonitorOptions options;
  options.interval_s = 0.01;
  std::mutex mutex;
  std::vector<Event> seen;
  Monitor monitor(options, {source}, [&](const Event& e) {
    std::lock_guard<std::mutex> lock(mutex);
    seen.push_back(e);
  });
  EXPECT_FALSE(monitor.running());
  monitor.start();
  EXPECT_TRUE(monitor.running());
  EXPECT_THROW(monitor.start(), InvalidArgument);
  ASSERT_TRUE(waitFor([&] { return monitor.polls() >= 8; }));
  monitor.stop();
  monitor.stop();  // idempotent
  EXPECT_FALSE(monitor.running());
  const std::uint64_t polls = monitor.polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(monitor.polls(), polls);  // really stopped
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(seen.size(), 2u);  // the script's last poll repeats: still one event each
  EXPECT_EQ(seen[0].metric, event_metric::kEccUncorrectable);
  EXPECT_EQ(seen[1].metric, event_metric::kRemapFailure);
  EXPECT_EQ(monitor.events().size(), 2u);
  EXPECT_EQ(monitor.lastReadings().size(), 2u);
  EXPECT_TRUE(monitor.errors().empty());
}

TEST(HealthMonitor, FailingSourceIsStoredAndOthersStillPolled) {
  auto good = std::make_shared<ScriptedSource>(
      std::vector<std::vector<Reading>>{{sensorReading(metric::kDeviceLost, 1)}}, "good");
  Monitor monitor(MonitorOptions{}, {std::make_shared<ThrowingSource>(), good}, nullptr);
  auto events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].metric, event_metric::kDeviceLost);
  monitor.pollOnce();
  const auto errors = monitor.errors();
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].source, "broken");
  EXPECT_EQ(errors[0].kind, ErrorKind::kIo);
  EXPECT_EQ(errors[0].message, "sensor bus unreadable");
  try {
    monitor.rethrowError();
    FAIL() << "nothing rethrown";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("broken: sensor bus unreadable"), std::string::npos);
  }
  EXPECT_THROW(monitor.rethrowError(), IoError);  // the second stored failure
  EXPECT_NO_THROW(monitor.rethrowError());         // nothing left
  EXPECT_EQ(good->calls(), 2u);
}

TEST(HealthMonitor, CallbackFailureIsStoredNotPropagated) {
  auto source =
      std::make_shared<ScriptedSource>(std::vector<std::vector<Reading>>{{sensorReading(metric::kRemapFailure, 1)}});
  Monitor monitor(MonitorOptions{}, {source}, [](const Event&) { throw std::runtime_error("manager bug"); });
  EXPECT_EQ(monitor.pollOnce().size(), 1u);
  ASSERT_EQ(monitor.errors().size(), 1u);
  EXPECT_EQ(monitor.errors()[0].source, "on_event");
  EXPECT_EQ(monitor.errors()[0].message, "manager bug");
}

TEST(HealthMonitor, StopFromCallbackIsRefused) {
  auto source =
      std::make_shared<ScriptedSource>(std::vector<std::vector<Reading>>{{sensorReading(metric::kRemapFailure, 1)}});
  MonitorOptions options;
  options.interval_s = 0.01;
  Monitor* self = nullptr;
  std::atomic<bool> refused{false};
  Monitor monitor(options, {source}, [&](const Event&) {
    try {
      self->stop();
    } catch (const InvalidArgument&) {
      refused = true;
    }
  });
  self = &monitor;
  monitor.start();
  ASSERT_TRUE(waitFor([&] { return refused.load(); }));
  monitor.stop();
}

TEST(HealthMonitor, ConcurrentStopsJoinOnce) {
  auto source = std::make_shared<ScriptedSource>(std::vector<std::vector<Reading>>{{}});
  for (int round = 0; round < 20; ++round) {
    MonitorOptions options;
    options.interval_s = 0.001;
    Monitor monitor(options, {source}, nullptr);
    monitor.start();
    std::vector<std::thread> stoppers;
    for (int i = 0; i < 4; ++i) stoppers.emplace_back([&] { monitor.stop(); });
    for (auto& t : stoppers) t.join();
    EXPECT_FALSE(monitor.running());
  }
}

TEST(HealthMonitor, NullSourceDuplicateNamesAndBadOptionsAreRejected) {
  EXPECT_THROW(Monitor(MonitorOptions{}, {nullptr}, nullptr), InvalidArgument);
  auto a = std::make_shared<ScriptedSource>(std::vector<std::vector<Reading>>{{}}, "same");
  auto b = std::make_shared<ScriptedSource>(std::vector<std::vector<Reading>>{{}}, "same");
  try {
    Monitor monitor(MonitorOptions{}, {a, b}, nullptr);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("sources[1]: another source is also named 'same'"), std::string::npos) << e.message();
  }
  MonitorOptions options;
  options.warning_interval_s = -1;
  EXPECT_THROW(Monitor(options, {}, nullptr), InvalidArgument);
}

TEST(HealthMonitor, DestructorStopsARunningMonitor) {
  auto source = std::make_shared<ScriptedSource>(std::vector<std::vector<Reading>>{{}});
  {
    MonitorOptions options;
    options.interval_s = 3600;  // stop must not wait for the interval
    Monitor monitor(options, {source}, nullptr);
    monitor.start();
    ASSERT_TRUE(waitFor([&] { return monitor.polls() >= 1; }));
  }
  EXPECT_EQ(source->calls(), 1u);
}

}  // namespace
}  // namespace lmr::health
