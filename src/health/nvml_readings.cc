// One reader per NVML query family; each adds readings to the poll in progress, or marks
// its metrics unsupported once (see nvml_state.h).
#include <string>
#include <vector>

#include "health/nvml_state.h"

namespace lmr::health {
namespace abi = nvml_abi;

void NvmlSource::State::readEcc() {
  if (lib->deviceGetTotalEccErrors == nullptr) {
    for (const char* m : {metric::kEccUncorrectableVolatile, metric::kEccUncorrectableAggregate,
                          metric::kEccCorrectableVolatile, metric::kEccCorrectableAggregate})
      markUnsupported(m, "the NVML library has no nvmlDeviceGetTotalEccErrors");
    return;
  }
  struct Query {
    const char* metric;
    int type;
    int counter;
  };
  const Query queries[] = {
      {metric::kEccUncorrectableVolatile, abi::kMemoryErrorUncorrected, abi::kVolatileEcc},
      {metric::kEccUncorrectableAggregate, abi::kMemoryErrorUncorrected, abi::kAggregateEcc},
      {metric::kEccCorrectableVolatile, abi::kMemoryErrorCorrected, abi::kVolatileEcc},
      {metric::kEccCorrectableAggregate, abi::kMemoryErrorCorrected, abi::kAggregateEcc},
  };
  for (const Query& q : queries) {
    if (!wanted(q.metric)) continue;
    unsigned long long count = 0;
    if (check(lib->deviceGetTotalEccErrors(handle, q.type, q.counter, &count), "nvmlDeviceGetTotalEccErrors",
              {q.metric}))
      add(q.metric, static_cast<double>(count));
  }
}

void NvmlSource::State::readRemap() {
  const std::initializer_list<const char*> metrics = {metric::kRemappedRowsCorrectable,
                                                      metric::kRemappedRowsUncorrectable, metric::kRemapPending,
                                                      metric::kRemapFailure};
  if (lib->deviceGetRemappedRows == nullptr) {
    for (const char* m : metrics) markUnsupported(m, "the NVML library has no nvmlDeviceGetRemappedRows");
    return;
  }
  if (!wanted(metric::kRemapFailure)) return;
  unsigned correctable = 0, uncorrectable = 0, pending = 0, failure = 0;
  if (!check(lib->deviceGetRemappedRows(handle, &correctable, &uncorrectable, &pending, &failure),
             "nvmlDeviceGetRemappedRows", metrics))
    return;
  add(metric::kRemappedRowsCorrectable, correctable);
  add(metric::kRemappedRowsUncorrectable, uncorrectable);
  add(metric::kRemapPending, pending ? 1 : 0);
  add(metric::kRemapFailure, failure ? 1 : 0);
}

void NvmlSource::State::readTemperature() {
  if (lib->deviceGetTemperature == nullptr) {
    markUnsupported(metric::kTemperature, "the NVML library has no nvmlDeviceGetTemperature");
  } else if (wanted(metric::kTemperature)) {
    unsigned celsius = 0;
    if (check(lib->deviceGetTemperature(handle, abi::kTemperatureGpu, &celsius), "nvmlDeviceGetTemperature",
              {metric::kTemperature}))
      add(metric::kTemperature, celsius);
  }
  const std::pair<const char*, int> limits[] = {{metric::kTemperatureShutdown, abi::kThresholdShutdown},
                                                {metric::kTemperatureSlowdown, abi::kThresholdSlowdown}};
  for (const auto& [m, which] : limits) {
    if (lib->deviceGetTemperatureThreshold == nullptr) {
      markUnsupported(m, "the NVML library has no nvmlDeviceGetTemperatureThreshold");
      continue;
    }
    if (!wanted(m)) continue;
    unsigned celsius = 0;
    if (check(lib->deviceGetTemperatureThreshold(handle, which, &celsius), "nvmlDeviceGetTemperatureThreshold", {m}))
      add(m, celsius);
  }
}

namespace {

double fieldNumber(const nvmlFieldValue_t& f) {
  switch (f.valueType) {
    case abi::kValueDouble: return f.value.dVal;
    case abi::kValueUnsignedInt: return f.value.uiVal;
    case abi::kValueUnsignedLong: return static_cast<double>(f.value.ulVal);
    case abi::kValueUnsignedLongLong: return static_cast<double>(f.value.ullVal);
    case abi::kValueSignedLongLong: return static_cast<double>(f.value.sllVal);
    case abi::kValueSignedInt: return f.value.siVal;
    case abi::kValueUnsignedShort: return f.value.usVal;
    default: return 0;
  }
}

const char* const kNvlinkErrorMetrics[] = {metric::kNvlinkReplay, metric::kNvlinkRecovery, metric::kNvlinkCrc};
const char* const kNvlinkCounterMetrics[] = {metric::kNvlinkCrc, metric::kNvlinkCrcFlit, metric::kNvlinkCrcData,
                                             metric::kNvlinkReplay, metric::kNvlinkRecovery};

}  // namespace

// Link count: the NVLink link-count field, else probing link states until NVML refuses.
// Then link states, then (one nvmlDeviceGetFieldValues call) the recovery action and, on
// devices with per-link DL counters (Hopper and later), replay/recovery/CRC per link.
void NvmlSource::State::readFields() {
  const bool have_fields = lib->deviceGetFieldValues != nullptr;
  if (!have_fields) markUnsupported(metric::kRecoveryAction, "the NVML library has no nvmlDeviceGetFieldValues");
  if (link_count < 0 && have_fields) {
    nvmlFieldValue_t f{};
    f.fieldId = abi::kFieldNvlinkLinkCount;
    if (lib->deviceGetFieldValues(handle, 1, &f) == abi::kSuccess && f.nvmlReturn == abi::kSuccess)
      link_count = static_cast<int>(fieldNumber(f));
  }
  readLinkStates();

  std::vector<nvmlFieldValue_t> fields;
  const bool want_action = have_fields && wanted(metric::kRecoveryAction);
  if (want_action) fields.push_back(nvmlFieldValue_t{abi::kFieldGpuRecoveryAction, 0, 0, 0, 0, 0, {}});
  const bool per_link = have_fields && link_count > 0 && per_link_fields != 0 && wanted(metric::kNvlinkCrc);
  if (per_link) {
    for (int link = 0; link < link_count; ++link)
      for (unsigned id :
           {abi::kFieldNvlinkErrorDlReplay, abi::kFieldNvlinkErrorDlRecovery, abi::kFieldNvlinkErrorDlCrc})
        fields.push_back(nvmlFieldValue_t{id, static_cast<unsigned>(link), 0, 0, 0, 0, {}});
  }
  if (!fields.empty()) {
    const nvmlReturn_t rc = lib->deviceGetFieldValues(handle, static_cast<int>(fields.size()), fields.data());
    const bool refused = rc == abi::kErrorNotSupported || rc == abi::kErrorFunctionNotFound;
    if (!check(rc, "nvmlDeviceGetFieldValues", {metric::kRecoveryAction})) {
      if (refused) {  // no field API: the legacy per-link counters are all there is
        per_link_fields = 0;
        readLegacyNvlink();
      }
      return;  // a failed call: no NVLink totals this poll rather than a mix of counter kinds
    }
    std::size_t next = 0;
    if (want_action) {
      const nvmlFieldValue_t& f = fields[next++];
      if (check(f.nvmlReturn, "GPU recovery action field", {metric::kRecoveryAction}))
        add(metric::kRecoveryAction, fieldNumber(f));
    }
    if (per_link) {
      std::size_t answered = 0, refused_fields = 0;
      nvmlReturn_t failure = abi::kSuccess;
      for (std::size_t i = next; i < fields.size(); ++i) {
        const nvmlFieldValue_t& f = fields[i];
        if (f.nvmlReturn == abi::kSuccess) {
          updateLink(static_cast<int>(f.fieldId), f.scopeId, fieldNumber(f));
          ++answered;
        } else if (f.nvmlReturn == abi::kErrorNotSupported || f.nvmlReturn == abi::kErrorFunctionNotFound) {
          ++refused_fields;
        } else {
          failure = f.nvmlReturn;
        }
      }
      if (answered == 0 && refused_fields == fields.size() - next) {
        per_link_fields = 0;  // before Hopper: no per-link DL fields, read the legacy counters
        readLegacyNvlink();
        return;
      }
      if (failure != abi::kSuccess && !check(failure, "per-link NVLink error fields", {}) && lost) return;
      per_link_fields = 1;
      const unsigned ids[3] = {abi::kFieldNvlinkErrorDlReplay, abi::kFieldNvlinkErrorDlRecovery,
                               abi::kFieldNvlinkErrorDlCrc};
      for (int i = 0; i < 3; ++i) {
        double total = 0;
        if (linkTotal(static_cast<int>(ids[i]), &total)) add(kNvlinkErrorMetrics[i], total);
      }
      markUnsupported(metric::kNvlinkCrcFlit, "this device reports one DL CRC count per link, not flit and data");
      markUnsupported(metric::kNvlinkCrcData, "this device reports one DL CRC count per link, not flit and data");
      return;
    }
  }
  readLegacyNvlink();
}

void NvmlSource::State::readLinkStates() {
  if (!wanted(metric::kNvlinkLinksActive)) return;
  if (lib->deviceGetNvLinkState == nullptr) {
    markUnsupported(metric::kNvlinkLinksActive, "the NVML library has no nvmlDeviceGetNvLinkState");
    return;
  }
  const unsigned limit = link_count >= 0 ? static_cast<unsigned>(link_count) : abi::kNvlinkMaxLinks;
  int active = 0, total = 0;
  std::string down;
  for (unsigned link = 0; link < limit; ++link) {
    int is_active = 0;
    const nvmlReturn_t rc = lib->deviceGetNvLinkState(handle, link, &is_active);
    if (rc == abi::kSuccess) {
      ++total;
      if (is_active) {
        ++active;
      } else {
        if (!down.empty()) down += ",";
        down += std::to_string(link);
      }
      continue;
    }
    if (link_count < 0 && (rc == abi::kErrorInvalidArgument || rc == abi::kErrorNotSupported))
      break;  // past the last link
    if (!check(rc, "nvmlDeviceGetNvLinkState", {metric::kNvlinkLinksActive})) return;
  }
  if (link_count < 0) link_count = total;
  if (link_count == 0) {
    markUnsupported(metric::kNvlinkLinksActive, "no NVLink links");
    markUnsupported(metric::kNvlinkLinksTotal, "no NVLink links");
    for (const char* m : kNvlinkCounterMetrics) markUnsupported(m, "no NVLink links");
    return;
  }
  ++attempted;  // the link-state sweep counts as one query
  add(metric::kNvlinkLinksActive, active, down.empty() ? "" : "inactive links: " + down);
  add(metric::kNvlinkLinksTotal, total);
}

void NvmlSource::State::readLegacyNvlink() {
  if (link_count <= 0 || !wanted(metric::kNvlinkCrc)) return;
  if (lib->deviceGetNvLinkErrorCounter == nullptr) {
    for (const char* m : kNvlinkCounterMetrics)
      markUnsupported(m, "the NVML library has no nvmlDeviceGetNvLinkErrorCounter");
    return;
  }
  const int counters[] = {abi::kNvlinkErrorReplay, abi::kNvlinkErrorRecovery, abi::kNvlinkErrorCrcFlit,
                          abi::kNvlinkErrorCrcData};
  constexpr int kLegacy = 1000;  // keys of the legacy counters in link_last, apart from the field ids
  nvmlReturn_t failure = abi::kSuccess;
  for (int link = 0; link < link_count; ++link) {
    for (int c : counters) {
      unsigned long long value = 0;
      const nvmlReturn_t rc = lib->deviceGetNvLinkErrorCounter(handle, static_cast<unsigned>(link), c, &value);
      if (rc == abi::kSuccess) {
        updateLink(kLegacy + c, static_cast<unsigned>(link), static_cast<double>(value));
      } else if (rc != abi::kErrorNotSupported && rc != abi::kErrorFunctionNotFound) {
        failure = rc;
      }
    }
  }
  if (failure != abi::kSuccess && !check(failure, "nvmlDeviceGetNvLinkErrorCounter", {}) && lost) return;
  double totals[4] = {0, 0, 0, 0};
  bool any = false;
  for (int i = 0; i < 4; ++i) any = linkTotal(kLegacy + counters[i], &totals[i]) || any;
  if (!any) {
    if (failure != abi::kSuccess) return;  // nothing answered this time; try again next poll
    for (const char* m : kNvlinkCounterMetrics)
      markUnsupported(m, "nvmlDeviceGetNvLinkErrorCounter answered for no link");
    return;
  }
  if (failure == abi::kSuccess) ++attempted;
  add(metric::kNvlinkReplay, totals[0]);
  add(metric::kNvlinkRecovery, totals[1]);
  add(metric::kNvlinkCrcFlit, totals[2]);
  add(metric::kNvlinkCrcData, totals[3]);
  add(metric::kNvlinkCrc, totals[2] + totals[3]);
}

void NvmlSource::State::readXids() {
  if (!options.xid_events) return;
  if (!xid_registered) {
    xid_registered = true;
    if (lib->eventSetCreate == nullptr || lib->deviceRegisterEvents == nullptr || lib->eventSetWait == nullptr) {
      markUnsupported(metric::kXid, "the NVML library has no event-set functions");
      return;
    }
    nvmlEventSet_t set = nullptr;
    nvmlReturn_t rc = lib->eventSetCreate(&set);
    if (rc == abi::kSuccess) {
      rc = lib->deviceRegisterEvents(handle, abi::kEventTypeXidCriticalError, set);
      if (rc != abi::kSuccess && lib->eventSetFree != nullptr) lib->eventSetFree(set);
    }
    if (rc != abi::kSuccess) {
      if (!check(rc, "XID event registration", {metric::kXid}) && !unsupported_metrics.count(metric::kXid))
        markUnsupported(metric::kXid, "XID event registration failed: " + lib->describe(rc));
      return;
    }
    events = set;
  }
  if (events == nullptr) return;
  for (int i = 0; i < 256; ++i) {  // drain what arrived since the last poll, without waiting
    nvmlEventData_t data{};
    const nvmlReturn_t rc = lib->eventSetWait(events, &data, 0);
    if (rc == abi::kErrorTimeout) break;
    if (rc != abi::kSuccess) {
      check(rc, "nvmlEventSetWait_v2", {metric::kXid});
      break;
    }
    if (data.eventType == abi::kEventTypeXidCriticalError)
      add(metric::kXid, static_cast<double>(data.eventData), "XID " + std::to_string(data.eventData));
  }
}

}  // namespace lmr::health
