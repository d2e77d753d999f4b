// health::Rules: readings to fatal and warning events (see include/lmr/health/monitor.h).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "lmr/common/error.h"
#include "lmr/health/monitor.h"

namespace lmr::health {
namespace {

// Not through iostreams: in a process where torch was loaded first, formatting a double
// through std::ostream inside _core crashed (seen on the accelerator machine, torch 2.11).
std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", v);
  return text;
}

std::string deviceKey(const std::string& source, const DeviceInfo& device) {
  return device.uuid.empty() ? source + "#" + std::to_string(device.index) : device.uuid;
}

bool is(const std::string& a, const char* b) { return a == b; }

}  // namespace

const char* severityName(Severity severity) { return severity == Severity::kFatal ? "fatal" : "warning"; }

void MonitorOptions::validate() const {
  auto positive = [](double v, const char* name) {
    if (!(std::isfinite(v) && v > 0))
      throw InvalidArgument(std::string(name) + ": must be a positive number, got " + number(v));
  };
  auto nonNegative = [](double v, const char* name) {
    if (!(std::isfinite(v) && v >= 0)) throw InvalidArgument(std::string(name) + ": must be >= 0, got " + number(v));
  };
  positive(interval_s, "interval_s");
  nonNegative(nvlink_error_threshold, "nvlink_error_threshold");
  positive(nvlink_window_s, "nvlink_window_s");
  nonNegative(temperature_margin_c, "temperature_margin_c");
  nonNegative(temperature_warning_margin_c, "temperature_warning_margin_c");
  nonNegative(warning_interval_s, "warning_interval_s");
  for (std::int64_t xid : fatal_xids)
    if (xid <= 0) throw InvalidArgument("fatal_xids: XIDs are positive integers, got " + std::to_string(xid));
}

nlohmann::json jsonValue(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<long long>(v);
  return v;
}

nlohmann::json toJson(const DeviceInfo& device) {
  return {{"index", device.index}, {"uuid", device.uuid}, {"pci_bus_id", device.pci_bus_id}, {"name", device.name}};
}

nlohmann::json toJson(const Event& event) {
  return {{"schema_version", 1},
          {"type", "lmr.health_event"},
          {"severity", severityName(event.severity)},
          {"metric", event.metric},
          {"value", jsonValue(event.value)},
          {"threshold", jsonValue(event.threshold)},
          {"device", toJson(event.device)},
          {"source", event.source},
          {"host", event.host},
          {"time", event.time_s},
          {"message", event.message}};
}

Rules::Rules(MonitorOptions options) : options_(std::move(options)) {
  options_.validate();
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) host_ = name;
}

void Rules::emit(const std::string& source, const Reading& r, const char* event_metric, Severity severity,
                 double threshold, std::string message, double now_s, std::vector<Event>* out,
                 const std::string& rate_suffix) {
  // `suffix` separates kinds within one metric (each XID code is its own).
  const Key key{deviceKey(source, r.device), std::string(event_metric) + rate_suffix};
  if (fatal_emitted_.count(key)) return;  // already fatal: nothing more to say about it
  if (severity == Severity::kFatal) {
    fatal_emitted_.insert(key);
  } else {
    auto last = warning_last_.find(key);
    if (last != warning_last_.end() && now_s - last->second < options_.warning_interval_s) return;
    warning_last_[key] = now_s;
  }
  out->push_back(Event{r.device, source, host_, event_metric, r.value, threshold, severity, now_s, std::move(message)});
}

void Rules::counterGrowth(const std::string& source, const Reading& r, const char* event_metric, Severity severity,
                          double now_s, std::vector<Event>* out) {
  const Key key{deviceKey(source, r.device), r.metric};
  auto it = counters_.find(key);
  if (it == counters_.end()) {
    counters_[key] = r.value;
    if (r.value > 0 && is(r.metric, metric::kEccUncorrectableVolatile))
      emit(source, r, event_metric, Severity::kWarning, 0,
           r.metric + " is " + number(r.value) + " when monitoring began (errors since the driver loaded)", now_s, out);
    return;
  }
  const double previous = it->second;
  it->second = r.value;  // a smaller value is a counter reset: the new baseline
  if (r.value > previous)
    emit(source, r, event_metric, severity, previous,
         r.metric + " grew from " + number(previous) + " to " + number(r.value), now_s, out);
}

double Rules::nvlinkDelta(const std::string& source, const Reading& r) {
  const Key key{deviceKey(source, r.device), r.metric};
  auto it = counters_.find(key);
  const double delta = it != counters_.end() && r.value >= it->second ? r.value - it->second : 0;  // reset: baseline
  counters_[key] = r.value;
  return delta;
}

void Rules::nvlinkGrowth(const std::string& source, const Reading& r, double delta, double now_s,
                         std::vector<Event>* out) {
  const Key key{deviceKey(source, r.device), event_metric::kNvlinkErrors};
  const bool first = nvlink_total_.count(key) == 0;
  double& total = nvlink_total_[key];
  total += delta;
  auto& history = nvlink_history_[key];
  if (!first && !history.empty()) {
    while (history.size() > 1 && history.front().first < now_s - options_.nvlink_window_s)
      history.erase(history.begin());
    const double growth = total - history.front().second;
    Reading shown = r;
    shown.value = growth;
    if (growth > options_.nvlink_error_threshold) {
      emit(source, shown, event_metric::kNvlinkErrors, Severity::kFatal, options_.nvlink_error_threshold,
           "NVLink CRC/replay/recovery errors grew by " + number(growth) + " within " +
               number(now_s - history.front().first) + " s",
           now_s, out);
    } else if (delta > 0) {
      emit(source, shown, event_metric::kNvlinkErrors, Severity::kWarning, options_.nvlink_error_threshold,
           "NVLink CRC/replay/recovery errors grew by " + number(delta), now_s, out);
    }
  }
  history.emplace_back(now_s, total);
}

void Rules::temperature(const std::string& source, const Reading& r, double now_s, std::vector<Event>* out) {
  const std::string device = deviceKey(source, r.device);
  auto limit = [&](const char* m) -> const double* {
    auto it = limits_.find(Key{device, m});
    return it == limits_.end() || it->second <= 0 ? nullptr : &it->second;
  };
  const double* shutdown = limit(metric::kTemperatureShutdown);
  const double* slowdown = limit(metric::kTemperatureSlowdown);
  // Fatal near shutdown, but never at or below the slowdown limit (some GPUs have the two
  // limits a few degrees apart): the GPU throttles there first.
  const double fatal_at =
      shutdown ? std::max(*shutdown - options_.temperature_margin_c, slowdown ? *slowdown + 1 : 0) : 0;
  if (shutdown && r.value >= fatal_at) {
    emit(source, r, event_metric::kTemperature, Severity::kFatal, fatal_at,
         "GPU at " + number(r.value) + " C, near its shutdown limit " + number(*shutdown) + " C (fatal from " +
             number(fatal_at) + " C)",
         now_s, out);
    return;
  }
  double warn_at = 0;
  if (slowdown) warn_at = *slowdown;
  else if (shutdown) warn_at = *shutdown - options_.temperature_warning_margin_c;
  if (warn_at > 0 && r.value >= warn_at)
    emit(source, r, event_metric::kTemperature, Severity::kWarning, warn_at,
         "GPU at " + number(r.value) + " C (warning at " + number(warn_at) + " C)", now_s, out);
}

std::vector<Event> Rules::evaluate(const std::string& source, const std::vector<Reading>& readings, double now_s) {
  std::vector<Event> out;
  // Limits first, so that their place in the poll does not matter.
  for (const Reading& r : readings)
    if (is(r.metric, metric::kTemperatureShutdown) || is(r.metric, metric::kTemperatureSlowdown))
      limits_[Key{deviceKey(source, r.device), r.metric}] = r.value;

  std::map<std::string, std::pair<double, const Reading*>> nvlink;  // device key -> (growth, a reading)
  for (const Reading& r : readings) {
    const std::string& m = r.metric;
    if (is(m, metric::kEccUncorrectableVolatile) || is(m, metric::kEccUncorrectableAggregate)) {
      counterGrowth(source, r, event_metric::kEccUncorrectable, Severity::kFatal, now_s, &out);
    } else if (is(m, metric::kEccCorrectableVolatile) || is(m, metric::kEccCorrectableAggregate)) {
      counterGrowth(source, r, event_metric::kEccCorrectable, Severity::kWarning, now_s, &out);
    } else if (is(m, metric::kRemappedRowsUncorrectable)) {
      counterGrowth(source, r, event_metric::kRemappedRows, Severity::kWarning, now_s, &out);
    } else if (is(m, metric::kRemapFailure)) {
      if (r.value >= 1)
        emit(source, r, event_metric::kRemapFailure, Severity::kFatal, 1, "row remapping failed", now_s, &out);
    } else if (is(m, metric::kRemapPending)) {
      if (r.value >= 1)
        emit(source, r, event_metric::kRemapPending, Severity::kWarning, 1,
             "a row remap is pending (applied at the next GPU reset)", now_s, &out);
    } else if (is(m, metric::kDeviceLost)) {
      if (r.value >= 1)
        emit(source, r, event_metric::kDeviceLost, Severity::kFatal, 1, r.detail.empty() ? "device lost" : r.detail,
             now_s, &out);
    } else if (is(m, metric::kXid)) {
      const auto code = static_cast<std::int64_t>(r.value);
      const bool fatal = options_.fatal_xids.count(code) > 0;
      emit(source, r, event_metric::kXid, fatal ? Severity::kFatal : Severity::kWarning, 0,
           "XID " + std::to_string(code) + (fatal ? " (configured fatal)" : "") +
               (r.detail.empty() ? "" : ": " + r.detail),
           now_s, &out, ":" + std::to_string(code));
    } else if (is(m, metric::kNvlinkCrc) || is(m, metric::kNvlinkReplay) || is(m, metric::kNvlinkRecovery)) {
      auto& entry = nvlink[deviceKey(source, r.device)];
      entry.first += nvlinkDelta(source, r);  // each counter on its own: one reset or gap does not skew the rest
      entry.second = &r;
    } else if (is(m, metric::kNvlinkLinksActive)) {
      double& most = limits_[Key{deviceKey(source, r.device), m}];
      if (r.value < most)
        emit(source, r, event_metric::kNvlinkLinkDown, Severity::kWarning, most,
             number(r.value) + " of " + number(most) + " NVLink links active" +
                 (r.detail.empty() ? "" : " (" + r.detail + ")"),
             now_s, &out);
      most = std::max(most, r.value);
    } else if (is(m, metric::kTemperature)) {
      temperature(source, r, now_s, &out);
    } else if (is(m, metric::kRecoveryAction)) {
      const auto action = static_cast<std::int64_t>(r.value);
      if (action == 3)
        emit(source, r, event_metric::kRecoveryAction, Severity::kWarning, 0,
             "driver asks to drain peer-to-peer traffic", now_s, &out);
      else if (action != 0)
        emit(source, r, event_metric::kRecoveryAction, Severity::kFatal, 0,
             "driver requests recovery action " + std::to_string(action) +
                 " (1 GPU reset, 2 node reboot, 4 drain and reset, 5 IMEX domain recovery, 6 bus reset, 7 system "
                 "reboot)",
             now_s, &out);
    }
  }
  for (const auto& [device, entry] : nvlink) nvlinkGrowth(source, *entry.second, entry.first, now_s, &out);
  return out;
}

}  // namespace lmr::health
