// NvmlSource's private state and per-poll bookkeeping, shared by nvml_source.cc (lookups,
// construction, poll) and nvml_readings.cc (one reader per NVML query family).
#pragma once

#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "health/nvml_library.h"
#include "lmr/health/nvml.h"

namespace lmr::health {

struct NvmlSource::State {
  const NvmlLibrary* lib = nullptr;
  nvmlDevice_t handle = nullptr;
  NvmlOptions options;
  std::set<std::string> unsupported_metrics;
  std::vector<UnsupportedMetric> unsupported;
  nvmlEventSet_t events = nullptr;
  int per_link_fields = -1;  // -1 unknown, 0 legacy counters only, 1 Hopper per-link fields
  int link_count = -1;       // -1 unknown
  bool xid_registered = false;  // the event set was tried (first poll)

  // One poll's bookkeeping.
  PollResult* out = nullptr;
  const DeviceInfo* device = nullptr;
  int attempted = 0;
  int failed = 0;
  bool lost = false;
  std::string failures;

  bool wanted(const char* metric) const { return unsupported_metrics.count(metric) == 0; }
  void markUnsupported(const std::string& metric, const std::string& reason) {
    if (!unsupported_metrics.insert(metric).second) return;
    UnsupportedMetric u{*device, metric, reason};
    unsupported.push_back(u);
    out->unsupported.push_back(std::move(u));
  }
  // true on success; otherwise records why (unsupported metrics, lost device, failure).
  bool check(nvmlReturn_t rc, const char* call, std::initializer_list<const char*> metrics) {
    ++attempted;
    if (rc == nvml_abi::kSuccess) return true;
    if (rc == nvml_abi::kErrorNotSupported || rc == nvml_abi::kErrorFunctionNotFound ||
        rc == nvml_abi::kErrorNoPermission) {
      for (const char* m : metrics) markUnsupported(m, std::string(call) + ": " + lib->describe(rc));
      --attempted;
      return false;
    }
    ++failed;
    if (rc == nvml_abi::kErrorGpuIsLost) lost = true;
    if (!failures.empty()) failures += "; ";
    failures += std::string(call) + ": " + lib->describe(rc);
    return false;
  }
  void add(const char* metric, double value, std::string detail = "") {
    out->readings.push_back(Reading{*device, metric, value, std::move(detail)});
  }

  void readEcc();
  void readRemap();
  void readTemperature();
  void readFields();  // NVLink link count, state and errors; the recovery action
  void readLinkStates();
  void readLegacyNvlink();
  void readXids();
};

}  // namespace lmr::health
