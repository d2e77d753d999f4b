// health::Monitor polls HealthSources in its own low-frequency thread and turns readings
// into events with health::Rules. Fatal events (a device needs replacing) are emitted once
// per (device, metric); warnings (precursors that do not request recovery) at most once per
// warning_interval_s per (device, metric).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lmr/common/error.h"
#include "lmr/common/mutex.h"
#include "lmr/health/source.h"

namespace lmr::health {

struct MonitorOptions {
  double interval_s = 5.0;  // between polls
  // XIDs that mean the GPU must be taken out of service (the set public tools agree on).
  std::set<std::int64_t> fatal_xids = {48, 74, 79, 95, 119, 120, 140};
  // NVLink CRC + replay + recovery errors gained within nvlink_window_s: more is fatal, any
  // growth at all is a warning.
  double nvlink_error_threshold = 100;
  double nvlink_window_s = 60;
  // Fatal when the temperature is within this many degrees of the shutdown limit (and above
  // the slowdown limit); warning at the slowdown limit (or, without one,
  // temperature_warning_margin_c below shutdown).
  double temperature_margin_c = 5;
  double temperature_warning_margin_c = 15;
  double warning_interval_s = 300;
  // Throws InvalidArgument naming the field.
  void validate() const;
  bool operator==(const MonitorOptions&) const = default;
};

enum class Severity { kWarning, kFatal };
const char* severityName(Severity severity);
// "fatal" or "warning"; InvalidArgument naming `path` otherwise.
Severity severityFromName(const std::string& name, const std::string& path = "severity");

// Event metrics (a family of readings: both ECC uncorrectable counters raise
// "ecc_uncorrectable").
namespace event_metric {
inline constexpr const char* kEccUncorrectable = "ecc_uncorrectable";
inline constexpr const char* kEccCorrectable = "ecc_correctable";
inline constexpr const char* kRemapFailure = "remap_failure";
inline constexpr const char* kRemapPending = "remap_pending";
inline constexpr const char* kRemappedRows = "remapped_rows_uncorrectable";
inline constexpr const char* kDeviceLost = "device_lost";
inline constexpr const char* kXid = "xid";
inline constexpr const char* kNvlinkErrors = "nvlink_errors";
inline constexpr const char* kNvlinkLinkDown = "nvlink_link_down";
inline constexpr const char* kTemperature = "temperature";
inline constexpr const char* kRecoveryAction = "recovery_action";
}  // namespace event_metric

// Every event metric name above.
const std::vector<const char*>& eventMetricNames();

struct Event {
  DeviceInfo device;
  std::string source;  // Source::name()
  std::string host;
  std::string metric;  // an event_metric name
  double value = 0;
  double threshold = 0;
  Severity severity = Severity::kWarning;
  double time_s = 0;  // seconds since the Unix epoch
  std::string message;
  bool operator==(const Event&) const = default;
};

inline constexpr const char* kEventType = "lmr.health_event";

// {"schema_version": 1, "type": kEventType, "device": {...}, "source", "host", "metric",
// "value", "threshold", "severity", "time", "message"}.
nlohmann::json toJson(const Event& event);
// The strict reader of toJson's document: every key required (schema_version optional, 1),
// no others, each of its type. Throws InvalidArgument starting with the JSON path
// ("device.index: ...").
Event parseEvent(const nlohmann::json& document);
// The GPU of an event as a fault-injection kit resource name: "<host>/gpu-<index>".
std::string resourceName(const Event& event);
// The kit failure kind an event is evidence of: resource_unavailable for a lost device,
// none otherwise.
std::optional<std::string> kitKind(const Event& event);
// A reading value as JSON: counts as integers, other values as they are.
nlohmann::json jsonValue(double value);
nlohmann::json toJson(const DeviceInfo& device);

// The decision rules, with the state they need between polls (previous counters, limits,
// what was already emitted), kept per device: its UUID, else the source name and index.
// Not thread-safe: one owner.
class Rules {
 public:
  explicit Rules(MonitorOptions options);
  // Events for one source's readings taken at now_s.
  std::vector<Event> evaluate(const std::string& source, const std::vector<Reading>& readings, double now_s);

 private:
  using Key = std::pair<std::string, std::string>;  // device key (UUID, else source#index), metric
  void counterGrowth(const std::string& source, const Reading& r, const char* event_metric, Severity severity,
                     double now_s, std::vector<Event>* out);
  // A cumulative NVLink counter's growth since its last reading (0 after a reset).
  double nvlinkDelta(const std::string& source, const Reading& r);
  void nvlinkGrowth(const std::string& source, const Reading& r, double delta, double now_s, std::vector<Event>* out);
  void temperature(const std::string& source, const Reading& r, double now_s, std::vector<Event>* out);
  void emit(const std::string& source, const Reading& r, const char* event_metric, Severity severity, double threshold,
            std::string message, double now_s, std::vector<Event>* out, const std::string& rate_suffix = "");
  MonitorOptions options_;
  std::map<Key, double> counters_;  // last value of each cumulative counter
  std::map<Key, double> limits_;    // temperature limits, most links seen active
  std::map<Key, double> nvlink_total_;  // per device: growth of all NVLink error counters since start
  std::map<Key, std::vector<std::pair<double, double>>> nvlink_history_;  // (time, total) in the window
  std::set<Key> fatal_emitted_;
  std::map<Key, double> warning_last_;
  std::string host_;
};

// A stored failure: a source that threw, or an on_event callback that threw.
struct SourceError {
  std::string source;
  ErrorKind kind = ErrorKind::kPeerFailure;
  std::string message;
  double time_s = 0;
};

using EventCallback = std::function<void(const Event&)>;

class Monitor {
 public:
  // on_event runs on the monitor thread (or the pollOnce caller); it must not call stop().
  Monitor(MonitorOptions options, std::vector<std::shared_ptr<Source>> sources, EventCallback on_event);
  ~Monitor();  // stops and joins
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // Starts the thread (first poll at once). Throws InvalidArgument when already running.
  void start();
  // Stops and joins; idempotent and safe from several threads at once (later callers wait
  // for the first). Blocks for at most one poll in progress. Throws InvalidArgument from the
  // monitor's own thread (an on_event callback).
  void stop();
  bool running() const;
  // True when called on the monitor's thread (inside a poll or an on_event callback).
  bool onMonitorThread() const;
  // One synchronous poll of every source (serialized with the thread's polls); returns the
  // events it produced, after delivering them to on_event.
  std::vector<Event> pollOnce();

  // Snapshots, safe from any thread.
  std::vector<Event> events() const;          // everything emitted, oldest first (last 1024)
  std::vector<SourceError> errors() const;    // stored failures, oldest first (last 256)
  std::vector<Reading> lastReadings() const;  // from the latest poll of each source
  std::vector<UnsupportedMetric> unsupported() const;
  std::uint64_t polls() const;
  // Rethrows (as lmr::Error) the oldest failure not yet rethrown, if any.
  void rethrowError();

 private:
  void run();
  void storeError(const std::string& source, ErrorKind kind, const std::string& message);
  MonitorOptions options_;
  std::vector<std::shared_ptr<Source>> sources_;
  EventCallback on_event_;
  Mutex stop_mutex_;  // serializes stop() callers
  Mutex poll_mutex_;  // serializes polls (held across Source::poll, never by readers)
  Rules rules_ LMR_GUARDED_BY(poll_mutex_);
  mutable Mutex mutex_;  // guards what follows; never held across a poll or callback
  std::condition_variable wake_;
  bool stop_ LMR_GUARDED_BY(mutex_) = false;
  bool running_ LMR_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // started under mutex_, joined under stop_mutex_ (not under mutex_)
  std::thread::id thread_id_ LMR_GUARDED_BY(mutex_);
  std::vector<Event> events_ LMR_GUARDED_BY(mutex_);
  std::vector<SourceError> errors_ LMR_GUARDED_BY(mutex_);
  std::size_t errors_rethrown_ LMR_GUARDED_BY(mutex_) = 0;
  std::uint64_t errors_dropped_ LMR_GUARDED_BY(mutex_) = 0;
  std::map<std::string, std::vector<Reading>> last_readings_ LMR_GUARDED_BY(mutex_);
  std::vector<UnsupportedMetric> unsupported_ LMR_GUARDED_BY(mutex_);
  std::uint64_t polls_ LMR_GUARDED_BY(mutex_) = 0;
};

}  // namespace lmr::health
