// The health vocabulary lists and the event document's strict reader (see
// include/lmr/health/monitor.h and source.h).
#include <string>

#include "lmr/common/json.h"
#include "lmr/health/monitor.h"

namespace lmr::health {
namespace {

using Json = nlohmann::json;
using json::child;

std::string member(const Json& object, const std::string& path, const char* key) {
  return json::asString(json::requireMember(object, path, key), child(path, key));
}

double number(const Json& object, const char* key) { return json::asNumber(json::requireMember(object, "", key), key); }

}  // namespace

const std::vector<const char*>& metricNames() {
  static const std::vector<const char*> names = {
      metric::kEccUncorrectableVolatile,
      metric::kEccUncorrectableAggregate,
      metric::kEccCorrectableVolatile,
      metric::kEccCorrectableAggregate,
      metric::kRemappedRowsCorrectable,
      metric::kRemappedRowsUncorrectable,
      metric::kRemapPending,
      metric::kRemapFailure,
      metric::kNvlinkCrc,
      metric::kNvlinkReplay,
      metric::kNvlinkRecovery,
      metric::kNvlinkCrcFlit,
      metric::kNvlinkCrcData,
      metric::kNvlinkLinksActive,
      metric::kNvlinkLinksTotal,
      metric::kTemperature,
      metric::kTemperatureShutdown,
      metric::kTemperatureSlowdown,
      metric::kRecoveryAction,
      metric::kDeviceLost,
      metric::kXid,
  };
  return names;
}

const std::vector<const char*>& eventMetricNames() {
  static const std::vector<const char*> names = {
      event_metric::kEccUncorrectable,
      event_metric::kEccCorrectable,
      event_metric::kRemapFailure,
      event_metric::kRemapPending,
      event_metric::kRemappedRows,
      event_metric::kDeviceLost,
      event_metric::kXid,
      event_metric::kNvlinkErrors,
      event_metric::kNvlinkLinkDown,
      event_metric::kTemperature,
      event_metric::kRecoveryAction,
  };
  return names;
}

Severity severityFromName(const std::string& name, const std::string& path) {
  if (name == severityName(Severity::kFatal)) return Severity::kFatal;
  if (name == severityName(Severity::kWarning)) return Severity::kWarning;
  json::fail(path, "must be \"fatal\" or \"warning\", got \"" + name + "\"");
}

Event parseEvent(const Json& d) {
  json::requireKnownKeys(d, "",
                         {"schema_version", "type", "device", "source", "host", "metric", "value", "threshold",
                          "severity", "time", "message"});
  if (member(d, "", "type") != kEventType) json::fail("type", "not a health event (" + json::describe(d["type"]) + ")");
  if (const Json* v = json::findMember(d, "schema_version"); v && json::asInteger(*v, "schema_version") != 1)
    json::fail("schema_version", "unsupported version " + json::describe(*v) + " (this reader knows 1)");
  const Json& device = json::requireMember(d, "", "device");
  json::requireKnownKeys(device, "device", {"index", "uuid", "pci_bus_id", "name"});
  Event e;
  const std::int64_t index = json::asInteger(json::requireMember(device, "device", "index"), "device.index");
  if (index < -1 || index > INT32_MAX) json::fail("device.index", "must be a device index or -1");
  e.device.index = static_cast<int>(index);
  e.device.uuid = member(device, "device", "uuid");
  e.device.pci_bus_id = member(device, "device", "pci_bus_id");
  e.device.name = member(device, "device", "name");
  e.source = member(d, "", "source");
  e.host = member(d, "", "host");
  e.metric = member(d, "", "metric");
  e.value = number(d, "value");
  e.threshold = number(d, "threshold");
  e.severity = severityFromName(member(d, "", "severity"));
  e.time_s = number(d, "time");
  e.message = member(d, "", "message");
  return e;
}

std::string resourceName(const Event& event) { return event.host + "/gpu-" + std::to_string(event.device.index); }

std::optional<std::string> kitKind(const Event& event) {
  if (event.metric == event_metric::kDeviceLost) return "resource_unavailable";
  return std::nullopt;
}

}  // namespace lmr::health
