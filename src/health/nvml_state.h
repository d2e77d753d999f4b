// NvmlSource's private state and per-poll bookkeeping, shared by nvml_source.cc (lookups,
// construction, poll) and nvml_readings.cc (one reader per NVML query family).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
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
  int all_failed_polls = 0;     // consecutive polls in which every query failed
  std::uint64_t polls = 0;      // polls completed
  // Per-link NVLink counters, (counter, link) -> last value. A link that does not answer in
  // a poll keeps its last value (a gap is not a reset); a link first seen after the first
  // poll is baselined (offset) so that its history does not count as new errors.
  std::map<std::pair<int, unsigned>, double> link_last;
  std::map<int, double> link_offset;
  void updateLink(int counter, unsigned link, double value) {
    const auto key = std::make_pair(counter, link);
    if (!link_last.count(key) && polls > 0) link_offset[counter] += value;
    link_last[key] = value;
  }
  // The GPU's total for `counter`; false when no link ever answered for it.
  bool linkTotal(int counter, double* total) const {
    bool any = false;
    double sum = 0;
    for (const auto& [key, value] : link_last)
      if (key.first == counter) sum += value, any = true;
    auto offset = link_offset.find(counter);
    *total = sum - (offset == link_offset.end() ? 0 : offset->second);
    return any;
  }
  std::mutex mutex;             // one poll at a time (Python and the monitor thread may share a source)

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
