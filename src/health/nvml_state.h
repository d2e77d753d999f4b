// NvmlSource's private state and per-poll bookkeeping, shared by nvml_source.cc (lookups,
// construction, poll) and nvml_readings.cc (one reader per NVML query family).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "health/nvml_library.h"
#include "lmr/common/mutex.h"
#include "lmr/health/nvml.h"

namespace lmr::health {

struct NvmlSource::State {
  const NvmlLibrary* lib = nullptr;
  nvmlDevice_t handle = nullptr;
  NvmlOptions options;
  std::set<std::string> unsupported_metrics LMR_GUARDED_BY(mutex);
  std::vector<UnsupportedMetric> unsupported LMR_GUARDED_BY(mutex);
  nvmlEventSet_t events LMR_GUARDED_BY(mutex) = nullptr;
  int per_link_fields LMR_GUARDED_BY(mutex) = -1;  // -1 unknown, 0 legacy counters only, 1 Hopper per-link fields
  int link_count LMR_GUARDED_BY(mutex) = -1;       // -1 unknown
  bool xid_registered LMR_GUARDED_BY(mutex) = false;  // the event set was tried (first poll)
  int all_failed_polls LMR_GUARDED_BY(mutex) = 0;     // consecutive polls in which every query failed
  std::uint64_t polls LMR_GUARDED_BY(mutex) = 0;      // polls completed
  // Per-link NVLink counters, (counter, link) -> last value. A link that does not answer in
  // a poll keeps its last value (a gap is not a reset); a link first seen after the first
  // poll is baselined (offset) so that its history does not count as new errors.
  std::map<std::pair<int, unsigned>, double> link_last LMR_GUARDED_BY(mutex);
  std::map<int, double> link_offset LMR_GUARDED_BY(mutex);
  void updateLink(int counter, unsigned link, double value) LMR_REQUIRES(mutex) {
    const auto key = std::make_pair(counter, link);
    if (!link_last.count(key) && polls > 0) link_offset[counter] += value;
    link_last[key] = value;
  }
  // The GPU's total for `counter`; false when no link ever answered for it.
  bool linkTotal(int counter, double* total) const LMR_REQUIRES(mutex) {
    bool any = false;
    double sum = 0;
    for (const auto& [key, value] : link_last)
      if (key.first == counter) sum += value, any = true;
    auto offset = link_offset.find(counter);
    *total = sum - (offset == link_offset.end() ? 0 : offset->second);
    return any;
  }
  Mutex mutex;  // one poll at a time (Python and the monitor thread may share a source); guards what follows

  // One poll's bookkeeping.
  PollResult* out LMR_GUARDED_BY(mutex) = nullptr;
  const DeviceInfo* device LMR_GUARDED_BY(mutex) = nullptr;
  int attempted LMR_GUARDED_BY(mutex) = 0;
  int failed LMR_GUARDED_BY(mutex) = 0;
  bool lost LMR_GUARDED_BY(mutex) = false;
  std::string failures LMR_GUARDED_BY(mutex);

  bool wanted(const char* metric) const LMR_REQUIRES(mutex) { return unsupported_metrics.count(metric) == 0; }
  void markUnsupported(const std::string& metric, const std::string& reason) LMR_REQUIRES(mutex) {
    if (!unsupported_metrics.insert(metric).second) return;
    UnsupportedMetric u{*device, metric, reason};
    unsupported.push_back(u);
    out->unsupported.push_back(std::move(u));
  }
  // true on success; otherwise records why (unsupported metrics, lost device, failure).
  bool check(nvmlReturn_t rc, const char* call, std::initializer_list<const char*> metrics) LMR_REQUIRES(mutex) {
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
  void add(const char* metric, double value, std::string detail = "") LMR_REQUIRES(mutex) {
    out->readings.push_back(Reading{*device, metric, value, std::move(detail)});
  }

  void readEcc() LMR_REQUIRES(mutex);
  void readRemap() LMR_REQUIRES(mutex);
  void readTemperature() LMR_REQUIRES(mutex);
  void readFields() LMR_REQUIRES(mutex);  // NVLink link count, state and errors; the recovery action
  void readLinkStates() LMR_REQUIRES(mutex);
  void readLegacyNvlink() LMR_REQUIRES(mutex);
  void readXids() LMR_REQUIRES(mutex);
};

}  // namespace lmr::health
