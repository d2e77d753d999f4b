// NvmlSource against the fake NVML (tests/cpp/health/fake_nvml.cc): the real dlopen path,
// every reading, unsupported metrics, a lost GPU, XID events, device lookups.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <thread>

#include "lmr/common/error.h"
#include "lmr/health/monitor.h"
#include "lmr/health/nvml.h"

namespace lmr::health {
namespace {

struct Fake {
  void (*reset)(unsigned);
  int (*set)(unsigned, const char*, long long);
  int (*fail)(unsigned, const char*, int);
  void (*push_xid)(unsigned, unsigned long long);
  unsigned long long (*calls)(const char*);

  static Fake& get() {
    static Fake fake = [] {
      void* handle = dlopen(LMR_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) throw std::runtime_error(dlerror());
      Fake f{};
      f.reset = reinterpret_cast<decltype(f.reset)>(dlsym(handle, "fake_nvml_reset"));
      f.set = reinterpret_cast<decltype(f.set)>(dlsym(handle, "fake_nvml_set"));
      f.fail = reinterpret_cast<decltype(f.fail)>(dlsym(handle, "fake_nvml_fail"));
      f.push_xid = reinterpret_cast<decltype(f.push_xid)>(dlsym(handle, "fake_nvml_push_xid"));
      f.calls = reinterpret_cast<decltype(f.calls)>(dlsym(handle, "fake_nvml_calls"));
      return f;
    }();
    return fake;
  }
};

NvmlOptions fakeOptions() {
  NvmlOptions options;
  options.library_path = LMR_FAKE_NVML_PATH;
  return options;
}

std::map<std::string, double> values(const PollResult& result) {
  std::map<std::string, double> out;
  for (const Reading& r : result.readings)
    if (r.metric != metric::kXid) out[r.metric] = r.value;
  return out;
}

std::vector<std::string> unsupportedNames(const PollResult& result) {
  std::vector<std::string> out;
  for (const auto& u : result.unsupported) out.push_back(u.metric);
  return out;
}

class Nvml : public ::testing::Test {
 protected:
  void SetUp() override { Fake::get().reset(2); }
  Fake& fake = Fake::get();
};

TEST_F(Nvml, HealthyDeviceReadsEverything) {
  EXPECT_EQ(nvmlDeviceCount(fakeOptions()), 2u);
  fake.set(1, "ecc_corrected_aggregate", 12);
  fake.set(1, "nvlink.2.crc_flit", 3);
  fake.set(1, "nvlink.2.crc_data", 4);
  fake.set(1, "nvlink.0.replay", 5);
  fake.set(1, "temperature", 47);
  NvmlSource source(1, fakeOptions());
  EXPECT_EQ(source.name(), "nvml:1");
  EXPECT_EQ(source.device().index, 1);
  EXPECT_EQ(source.device().uuid, "GPU-00000000-fa4e-4000-8000-000000000001");
  EXPECT_EQ(source.device().pci_bus_id, "00000000:19:00.0");
  EXPECT_EQ(source.device().name, "NVIDIA H200 (fake)");
  const PollResult result = source.poll();
  auto v = values(result);
  EXPECT_EQ(v[metric::kEccCorrectableAggregate], 12);
  EXPECT_EQ(v[metric::kEccUncorrectableVolatile], 0);
  EXPECT_EQ(v[metric::kRemapFailure], 0);
  EXPECT_EQ(v[metric::kRemappedRowsCorrectable], 0);
  EXPECT_EQ(v[metric::kTemperature], 47);
  EXPECT_EQ(v[metric::kTemperatureShutdown], 92);
  EXPECT_EQ(v[metric::kTemperatureSlowdown], 89);
  EXPECT_EQ(v[metric::kNvlinkLinksActive], 4);
  EXPECT_EQ(v[metric::kNvlinkLinksTotal], 4);
  EXPECT_EQ(v[metric::kNvlinkCrc], 7);  // Hopper mode: one DL CRC count per link, summed
  EXPECT_EQ(v[metric::kNvlinkReplay], 5);
  EXPECT_EQ(v[metric::kRecoveryAction], 0);
  EXPECT_EQ(v[metric::kDeviceLost], 0);
  // Hopper has no flit/data split: said once.
  EXPECT_EQ(unsupportedNames(result), (std::vector<std::string>{metric::kNvlinkCrcFlit, metric::kNvlinkCrcData}));
  EXPECT_TRUE(source.poll().unsupported.empty());
  EXPECT_EQ(source.unsupported().size(), 2u);
}

TEST_F(Nvml, LegacyNvlinkCountersBeforeHopper) {
  fake.set(0, "nvlink_per_link_fields", 0);
  fake.set(0, "nvlink.1.crc_flit", 10);
  fake.set(0, "nvlink.3.crc_data", 1);
  fake.set(0, "nvlink.3.recovery", 2);
  NvmlSource source(0, fakeOptions());
  auto v = values(source.poll());
  EXPECT_EQ(v[metric::kNvlinkCrcFlit], 10);
  EXPECT_EQ(v[metric::kNvlinkCrcData], 1);
  EXPECT_EQ(v[metric::kNvlinkCrc], 11);
  EXPECT_EQ(v[metric::kNvlinkRecovery], 2);
}

TEST_F(Nvml, UnsupportedMetricIsReportedOnceAndNotQueriedAgain) {
  fake.fail(0, "remapped_rows", 3);  // NVML_ERROR_NOT_SUPPORTED
  fake.set(0, "recovery_action", -1);
  NvmlSource source(0, fakeOptions());
  const PollResult first = source.poll();
  auto names = unsupportedNames(first);
  for (const char* m : {metric::kRemappedRowsCorrectable, metric::kRemappedRowsUncorrectable, metric::kRemapPending,
                        metric::kRemapFailure, metric::kRecoveryAction})
    EXPECT_NE(std::find(names.begin(), names.end(), m), names.end()) << m;
  EXPECT_EQ(values(first).count(metric::kRemapFailure), 0u);
  EXPECT_EQ(values(first)[metric::kDeviceLost], 0);  // unsupported is not failure
  const auto calls = fake.calls("nvmlDeviceGetRemappedRows");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(source.poll().unsupported.empty());
  EXPECT_EQ(fake.calls("nvmlDeviceGetRemappedRows"), calls);
  EXPECT_EQ(fake.calls("nvmlDeviceGetTotalEccErrors"), 4u * 4u);  // still polled
}

TEST_F(Nvml, MonitorSeesEccGrowthRemapFailureAndRecoveryAction) {
  auto source = std::make_shared<NvmlSource>(0, fakeOptions());
  Monitor monitor(MonitorOptions{}, {source}, nullptr);
  EXPECT_TRUE(monitor.pollOnce().empty());
  fake.set(0, "ecc_uncorrected_volatile", 1);
  fake.set(0, "ecc_uncorrected_aggregate", 1);
  fake.set(0, "remap_pending", 1);
  auto events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].metric, event_metric::kEccUncorrectable);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].device.uuid, source->device().uuid);
  EXPECT_EQ(events[1].metric, event_metric::kRemapPending);
  EXPECT_EQ(events[1].severity, Severity::kWarning);
  fake.set(0, "remap_failure", 1);
  fake.set(0, "recovery_action", 1);
  events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].metric, event_metric::kRemapFailure);
  EXPECT_EQ(events[1].metric, event_metric::kRecoveryAction);
  EXPECT_TRUE(monitor.pollOnce().empty());  // each fatal once
}

TEST_F(Nvml, LostGpuIsFatal) {
  auto source = std::make_shared<NvmlSource>(1, fakeOptions());
  Monitor monitor(MonitorOptions{}, {source}, nullptr);
  monitor.pollOnce();
  fake.fail(1, "all", 15);  // NVML_ERROR_GPU_IS_LOST
  auto events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].metric, event_metric::kDeviceLost);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_NE(events[0].message.find("GPU is lost"), std::string::npos) << events[0].message;
  EXPECT_TRUE(monitor.pollOnce().empty());
}

TEST_F(Nvml, EveryQueryFailingIsDeviceLoss) {
  NvmlSource source(0, fakeOptions());
  source.poll();
  fake.fail(0, "all", 999);  // NVML_ERROR_UNKNOWN everywhere
  EXPECT_EQ(values(source.poll())[metric::kDeviceLost], 0);  // one bad poll is not a lost GPU
  EXPECT_EQ(values(source.poll())[metric::kDeviceLost], 0);
  auto v = values(source.poll());
  EXPECT_EQ(v[metric::kDeviceLost], 1);  // the third in a row is
  fake.fail(0, "all", 0);
  fake.fail(0, "temperature", 999);  // one query failing is not loss
  v = values(source.poll());
  EXPECT_EQ(v[metric::kDeviceLost], 0);
  EXPECT_EQ(v.count(metric::kTemperature), 0u);
  EXPECT_EQ(v[metric::kEccCorrectableVolatile], 0);
}

TEST_F(Nvml, XidEventsArriveBetweenPolls) {
  auto source = std::make_shared<NvmlSource>(0, fakeOptions());
  Monitor monitor(MonitorOptions{}, {source}, nullptr);
  EXPECT_TRUE(monitor.pollOnce().empty());  // registers for XID events
  fake.push_xid(0, 31);
  fake.push_xid(1, 79);  // another GPU: not ours
  auto events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].metric, event_metric::kXid);
  EXPECT_EQ(events[0].value, 31);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  fake.push_xid(0, 79);
  events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].value, 79);
}

TEST_F(Nvml, XidRegistrationRefusedIsUnsupported) {
  fake.fail(0, "register_events", 4);  // NVML_ERROR_NO_PERMISSION
  NvmlSource source(0, fakeOptions());
  auto names = unsupportedNames(source.poll());
  EXPECT_NE(std::find(names.begin(), names.end(), metric::kXid), names.end());
}

TEST_F(Nvml, NvlinkErrorsAndLinkDownThroughTheMonitor) {
  auto source = std::make_shared<NvmlSource>(0, fakeOptions());
  Monitor monitor(MonitorOptions{}, {source}, nullptr);
  monitor.pollOnce();
  fake.set(0, "nvlink.1.crc_flit", 150);
  fake.set(0, "nvlink.2.active", 0);
  auto events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].metric, event_metric::kNvlinkLinkDown);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  EXPECT_EQ(events[1].metric, event_metric::kNvlinkErrors);
  EXPECT_EQ(events[1].severity, Severity::kFatal);
  EXPECT_EQ(events[1].value, 150);
}

TEST_F(Nvml, NvlinkGapsAreNotResets) {
  auto source = std::make_shared<NvmlSource>(0, fakeOptions());
  Monitor monitor(MonitorOptions{}, {source}, nullptr);
  fake.set(0, "nvlink.1.crc_flit", 1000);  // old errors: the baseline
  monitor.pollOnce();
  fake.fail(0, "field.163", 999);  // the CRC fields fail for a poll: last values stand
  fake.set(0, "nvlink.1.crc_flit", 1040);
  EXPECT_TRUE(monitor.pollOnce().empty());
  fake.fail(0, "field.163", 0);
  auto events = monitor.pollOnce();
  ASSERT_EQ(events.size(), 1u);  // 40 new errors: a warning, not the 1040 of the link's life
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  EXPECT_EQ(events[0].value, 40);
  fake.fail(0, "field_values", 999);  // the whole call fails once: no legacy fallback
  const PollResult failed = source->poll();
  for (const Reading& r : failed.readings) EXPECT_NE(r.metric, metric::kNvlinkCrcFlit);
  fake.fail(0, "field_values", 0);
  std::map<std::string, double> v = values(source->poll());
  EXPECT_EQ(v[metric::kNvlinkCrc], 1040);
  EXPECT_EQ(v.count(metric::kNvlinkCrcFlit), 0u);
}

TEST_F(Nvml, ConcurrentPollsOfOneSource) {
  NvmlSource source(0, fakeOptions());
  std::vector<std::thread> pollers;
  for (int i = 0; i < 4; ++i)
    pollers.emplace_back([&] {
      for (int k = 0; k < 50; ++k) {
        EXPECT_EQ(values(source.poll())[metric::kDeviceLost], 0);
        source.unsupported();
      }
    });
  for (auto& t : pollers) t.join();
}

TEST_F(Nvml, NoNvlinkMeansUnsupportedNotZero) {
  fake.set(0, "nvlink_links", 0);
  NvmlSource source(0, fakeOptions());
  const PollResult result = source.poll();
  EXPECT_EQ(values(result).count(metric::kNvlinkCrc), 0u);
  auto names = unsupportedNames(result);
  EXPECT_NE(std::find(names.begin(), names.end(), metric::kNvlinkLinksActive), names.end());
}

TEST_F(Nvml, IndexOutOfRangeAndLookups) {
  EXPECT_THROW(NvmlSource(7, fakeOptions()), InvalidArgument);
  EXPECT_EQ(nvmlIndexByUuid("GPU-00000000-fa4e-4000-8000-000000000001", fakeOptions()), 1u);
  EXPECT_EQ(nvmlIndexByUuid("GPU-00000000-fa4e-4000-8000-000000000000", fakeOptions()), 0u);
}

TEST_F(Nvml, UuidPrefixMustBeUnique) {
  EXPECT_THROW(nvmlIndexByUuid("GPU-00000000", fakeOptions()), InvalidArgument);
  EXPECT_THROW(nvmlIndexByUuid("GPU-ffff", fakeOptions()), InvalidArgument);
  EXPECT_EQ(nvmlIndexByPciBusId("00000000:19:00.0", fakeOptions()), 1u);
  EXPECT_EQ(nvmlIndexByPciBusId("0000:18:00.0", fakeOptions()), 0u);
  EXPECT_EQ(nvmlIndexByPciBusId("19:00.0", fakeOptions()), 1u);
  EXPECT_THROW(nvmlIndexByPciBusId("0000:40:00.0", fakeOptions()), InvalidArgument);
  EXPECT_THROW(nvmlIndexByPciBusId("not-a-bus", fakeOptions()), InvalidArgument);
}

TEST(NvmlVisibleDevices, CudaRulesForCudaVisibleDevices) {
  EXPECT_EQ(parseVisibleDevice("", false, 3).index, 3u);
  EXPECT_EQ(parseVisibleDevice("2,0", true, 0).index, 2u);
  EXPECT_EQ(parseVisibleDevice("2, 0", true, 1).index, 0u);
  const VisibleDevice uuid = parseVisibleDevice("GPU-abc,1", true, 0);
  EXPECT_EQ(uuid.kind, VisibleDevice::Kind::kUuid);
  EXPECT_EQ(uuid.uuid, "GPU-abc");
  EXPECT_THROW(parseVisibleDevice("1,x,2", true, 1), InvalidArgument);  // CUDA stops at the invalid entry
  EXPECT_THROW(parseVisibleDevice("", true, 0), InvalidArgument);       // set but empty: no GPU
  EXPECT_THROW(parseVisibleDevice("MIG-123", true, 0), Unsupported);
  EXPECT_THROW(parseVisibleDevice("0", true, -1), InvalidArgument);
}

TEST_F(Nvml, CudaOrdinalToNvmlIndex) {
  EXPECT_EQ(nvmlIndexForCudaOrdinal(0, "00000000:19:00.0", fakeOptions()), 1u);
  ::setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-fa4e-4000-8000-000000000001,0", 1);
  EXPECT_EQ(nvmlIndexForCudaOrdinal(0, "", fakeOptions()), 1u);
  EXPECT_EQ(nvmlIndexForCudaOrdinal(1, "", fakeOptions()), 0u);  // same model everywhere: PCI order
  ::setenv("CUDA_VISIBLE_DEVICES", "5", 1);
  EXPECT_THROW(nvmlIndexForCudaOrdinal(0, "", fakeOptions()), InvalidArgument);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(nvmlIndexForCudaOrdinal(1, "", fakeOptions()), 1u);
}

TEST_F(Nvml, MissingLibraryIsAClearError) {
  nvmlDeviceCount(fakeOptions());
  NvmlOptions other;
  other.library_path = "/nonexistent/libnvidia-ml.so.1";
  try {
    NvmlSource source(0, other);
    FAIL() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(e.message().find("cannot load NVML (/nonexistent/libnvidia-ml.so.1)"), std::string::npos) << e.message();
  }
  EXPECT_EQ(nvmlDeviceCount(fakeOptions()), 2u);  // the loaded one is unaffected
}

}  // namespace
}  // namespace lmr::health
