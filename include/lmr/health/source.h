// What a hardware health source reports: typed readings per physical device and metric.
// A Source is polled by health::Monitor from its own thread; the monitor never calls one
// Source from two threads at once. Sources may block briefly (an NVML call) but must not
// wait for training progress.
#pragma once

#include <string>
#include <vector>

namespace lmr::health {

// The physical device a reading is about. index is the source's own numbering (for NVML
// the physical NVML index, not the CUDA ordinal after CUDA_VISIBLE_DEVICES remapping).
struct DeviceInfo {
  int index = -1;
  std::string uuid;        // "GPU-..." where known, else empty
  std::string pci_bus_id;  // "00000000:18:00.0" where known, else empty
  std::string name;        // product name where known
  bool operator==(const DeviceInfo&) const = default;
};

// The metric vocabulary the monitor's rules understand. A source may report other metric
// names too: they are kept in snapshots and probes but never raise events.
namespace metric {
// Cumulative counters (the monitor compares successive readings).
inline constexpr const char* kEccUncorrectableVolatile = "ecc_uncorrectable_volatile";
inline constexpr const char* kEccUncorrectableAggregate = "ecc_uncorrectable_aggregate";
inline constexpr const char* kEccCorrectableVolatile = "ecc_correctable_volatile";
inline constexpr const char* kEccCorrectableAggregate = "ecc_correctable_aggregate";
inline constexpr const char* kRemappedRowsCorrectable = "remapped_rows_correctable";
inline constexpr const char* kRemappedRowsUncorrectable = "remapped_rows_uncorrectable";
inline constexpr const char* kNvlinkCrcFlit = "nvlink_crc_flit_errors";  // summed over links
inline constexpr const char* kNvlinkCrcData = "nvlink_crc_data_errors";
inline constexpr const char* kNvlinkCrc = "nvlink_crc_errors";  // flit + data, or the per-link DL CRC total
inline constexpr const char* kNvlinkReplay = "nvlink_replay_errors";
inline constexpr const char* kNvlinkRecovery = "nvlink_recovery_errors";
// States (the value now is what matters).
inline constexpr const char* kRemapPending = "remap_pending";  // 0 or 1
inline constexpr const char* kRemapFailure = "remap_failure";  // 0 or 1: remapping exhausted or failed
inline constexpr const char* kNvlinkLinksActive = "nvlink_links_active";
inline constexpr const char* kNvlinkLinksTotal = "nvlink_links_total";
inline constexpr const char* kTemperature = "temperature_c";
inline constexpr const char* kTemperatureShutdown = "temperature_shutdown_c";
inline constexpr const char* kTemperatureSlowdown = "temperature_slowdown_c";
inline constexpr const char* kRecoveryAction = "recovery_action";  // NVML GPU recovery action code
inline constexpr const char* kDeviceLost = "device_lost";          // 1: the device is gone
// Events (each reading is one occurrence; value is the code).
inline constexpr const char* kXid = "xid";
}  // namespace metric

// Every metric name above, counters first (the vocabulary a source should report in).
const std::vector<const char*>& metricNames();

struct Reading {
  DeviceInfo device;
  std::string metric;
  double value = 0;
  std::string detail;  // optional free text (an XID's description, a link list)
  bool operator==(const Reading&) const = default;
};

// A metric a device does not support. Sources report each once and stop querying it.
struct UnsupportedMetric {
  DeviceInfo device;
  std::string metric;
  std::string reason;
  bool operator==(const UnsupportedMetric&) const = default;
};

struct PollResult {
  std::vector<Reading> readings;
  std::vector<UnsupportedMetric> unsupported;  // newly found unsupported this poll (each once)
};

// A source of readings. Implement poll() in C++ or (through the bindings) in Python.
class Source {
 public:
  virtual ~Source() = default;
  Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // A short name for logs and events ("nvml:0").
  virtual std::string name() const = 0;
  // One reading of everything the source can see. Throws lmr::Error on failure; the
  // monitor stores the error and polls again next interval.
  virtual PollResult poll() = 0;
};

}  // namespace lmr::health
