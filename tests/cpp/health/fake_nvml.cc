// A small fake of the NVIDIA NVML library for tests (no GPU needed).
//
// Built as a shared object and opened with dlopen by the NVML health source in place of
// libnvidia-ml.so.1. It exports exactly the NVML functions declared in
// src/health/nvml_api.h, backed by in-memory per-device state that tests steer through a
// small control API (extern "C", looked up with dlsym on the same handle):
//
//   void fake_nvml_reset(unsigned device_count)
//       device_count (at most 256) healthy devices: name "NVIDIA H200 (fake)",
//       uuid "GPU-00000000-fa4e-4000-8000-00000000000N" (N = index, 12 hex digits),
//       busId "00000000:XX:00.0" / busIdLegacy "0000:XX:00.0" with XX = 0x18 + index,
//       ECC 0, remapped rows 0/0/0/0, temperature 40 (shutdown 92, slowdown 89),
//       4 active NVLink links with zero counters, per-link-fields (Hopper) mode on,
//       recovery action 0, no failures, XID queues / pending XIDs / call counters cleared.
//       Device handles stay stable across resets (same index -> same pointer).
//   int fake_nvml_set(unsigned device, const char* key, long long value)
//       0, or -1 for an unknown device/key or an out-of-range value. Keys:
//       ecc_{corrected,uncorrected}_{volatile,aggregate}, remap_{correctable,uncorrectable,
//       pending,failure}, temperature, temperature_shutdown, temperature_slowdown,
//       nvlink_links (0..36), nvlink_per_link_fields (0/1), recovery_action (-1 =
//       unsupported), nvlink.L.{active,replay,recovery,crc_flit,crc_data} (L < link count).
//   int fake_nvml_fail(unsigned device, const char* query, int nvml_return)
//       makes a query family return nvml_return (0 clears). Families: ecc, remapped_rows,
//       temperature, temperature_threshold, nvlink_state, nvlink_error_counter,
//       field_values, register_events, uuid, name, pci_info, all (every function taking a
//       device handle, including nvmlDeviceGetIndex; the GetHandleBy* lookups keep
//       working), field.<id> (that field's entry only), and the global "init" (device
//       ignored). -1 for an unknown family/device.
//   void fake_nvml_push_xid(unsigned device, unsigned long long xid)
//       queues the XID on every event set registered for that device.
//   unsigned long long fake_nvml_calls(const char* function)
//       calls of the named NVML function since the last reset (0 for unknown names).
//   int fake_nvml_init_count(void)
//       successful nvmlInit_v2 calls since load.
//
// At load the library resets to 2 devices, then applies LMR_FAKE_NVML, a ';'-separated
// list such as "devices=3;0.ecc_uncorrected_volatile=4;1.fail.remapped_rows=3;1.xid=79":
// "devices=N" (applied first, wherever it is), "D.key=V" (fake_nvml_set),
// "D.fail.family=CODE" (fake_nvml_fail) and "D.xid=X" (a pending XID delivered to every
// event set that registers for device D later). Bad items are reported on stderr and
// ignored.
//
// All state is guarded by one mutex: the health monitor polls from a background thread
// while tests mutate the state. Nothing here throws across the C boundary.

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "health/nvml_api.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

namespace abi = lmr::health::nvml_abi;

constexpr nvmlReturn_t kErrorInsufficientSize = 7;  // not in nvml_api.h
constexpr unsigned kMaxDevices = 256;

struct Link {
  bool active = true;
  unsigned long long replay = 0, recovery = 0, crc_flit = 0, crc_data = 0;
};

struct Device {
  unsigned index = 0;
  std::string name, uuid;
  nvmlPciInfo_t pci{};
  unsigned long long ecc[2][2] = {};  // [error type][counter type]
  unsigned remap_corr = 0, remap_unc = 0, remap_pending = 0, remap_failure = 0;
  unsigned temperature = 40, shutdown = 92, slowdown = 89;
  std::vector<Link> links;
  bool per_link_fields = true;
  long long recovery_action = 0;
  std::map<std::string, int> fails;      // family -> nvmlReturn_t
  std::map<unsigned, int> field_fails;   // field id -> nvmlReturn_t
  std::vector<unsigned long long> pending_xids;  // from LMR_FAKE_NVML
};

struct EventSet {
  std::set<Device*> devices;
  std::deque<std::pair<Device*, unsigned long long>> queue;
};

struct State {
  std::mutex mu;
  std::vector<std::unique_ptr<Device>> pool;  // never shrinks: handles stay valid
  unsigned count = 0;
  std::set<EventSet*> sets;
  std::map<std::string, unsigned long long> calls;
  int init_fail = 0;
  int init_count = 0;
};

State& S() {
  static State* s = new State;  // leaked on purpose: safe against late callers at exit
  return *s;
}

void ResetDevice(Device& d, unsigned index) {
  d = Device{};
  d.index = index;
  d.name = "NVIDIA H200 (fake)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "GPU-00000000-fa4e-4000-8000-%012x", index);
  d.uuid = buf;
  d.pci.domain = 0;
  d.pci.bus = 0x18 + index;
  d.pci.device = 0;
  d.pci.pciDeviceId = 0x233510DE;
  d.pci.pciSubSystemId = 0x18BE10DE;
  std::snprintf(d.pci.busId, sizeof d.pci.busId, "%08X:%02X:%02X.0", d.pci.domain, d.pci.bus, d.pci.device);
  std::snprintf(d.pci.busIdLegacy, sizeof d.pci.busIdLegacy, "%04X:%02X:%02X.0", d.pci.domain, d.pci.bus & 0xFF,
                d.pci.device);
  d.links.assign(4, Link{});
}

// Returns the live device behind a handle, or nullptr.
Device* Lookup(State& s, nvmlDevice_t h) {
  for (unsigned i = 0; i < s.count; ++i)
    if (reinterpret_cast<nvmlDevice_t>(s.pool[i].get()) == h) return s.pool[i].get();
  return nullptr;
}

nvmlDevice_t Handle(Device* d) { return reinterpret_cast<nvmlDevice_t>(d); }

int FailCode(const Device& d, const char* family) {
  auto it = d.fails.find(family);
  if (it != d.fails.end()) return it->second;
  it = d.fails.find("all");
  return it != d.fails.end() ? it->second : 0;
}

// Common prologue of a per-device query: counts the call, takes the lock, resolves the
// handle and applies a configured failure. On a non-zero *rc the caller returns it.
struct Query {
  std::unique_lock<std::mutex> lock;
  Device* dev = nullptr;
  nvmlReturn_t rc = abi::kSuccess;
  Query(const char* fn, nvmlDevice_t h, const char* family) : lock(S().mu) {
    S().calls[fn]++;
    dev = Lookup(S(), h);
    if (dev == nullptr) rc = abi::kErrorInvalidArgument;
    else rc = FailCode(*dev, family);
  }
};

void Count(const char* fn) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().calls[fn]++;
}

nvmlReturn_t CopyString(const std::string& src, char* buf, unsigned size) {
  if (buf == nullptr) return abi::kErrorInvalidArgument;
  if (size < src.size() + 1) return kErrorInsufficientSize;
  std::memcpy(buf, src.c_str(), src.size() + 1);
  return abi::kSuccess;
}

// Parses "D:B:D.F" (any domain width) into numbers; false when malformed.
bool ParseBusId(const char* s, unsigned v[4]) {
  int n = 0;
  return std::sscanf(s, "%x:%x:%x.%x%n", &v[0], &v[1], &v[2], &v[3], &n) == 4 && s[n] == '\0';
}

bool ParseLL(const std::string& s, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

// Sets a per-link key ("L.field"); called with the lock held.
bool SetLinkKey(Device& d, const std::string& rest, long long v) {
  size_t dot = rest.find('.');
  long long link = 0;
  if (dot == std::string::npos || !ParseLL(rest.substr(0, dot), &link)) return false;
  if (link < 0 || link >= static_cast<long long>(d.links.size()) || v < 0) return false;
  Link& l = d.links[link];
  std::string f = rest.substr(dot + 1);
  if (f == "active" && v <= 1) l.active = v != 0;
  else if (f == "replay") l.replay = v;
  else if (f == "recovery") l.recovery = v;
  else if (f == "crc_flit") l.crc_flit = v;
  else if (f == "crc_data") l.crc_data = v;
  else return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------- control API

FAKE_EXPORT void fake_nvml_reset(unsigned device_count) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  device_count = std::min(device_count, kMaxDevices);
  while (s.pool.size() < device_count) s.pool.push_back(std::make_unique<Device>());
  for (unsigned i = 0; i < device_count; ++i) ResetDevice(*s.pool[i], i);
  s.count = device_count;
  for (EventSet* es : s.sets) es->queue.clear();
  s.calls.clear();
  s.init_fail = 0;
}

FAKE_EXPORT int fake_nvml_set(unsigned device, const char* key, long long value) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (device >= s.count || key == nullptr) return -1;
  Device& d = *s.pool[device];
  const std::string k = key;
  const bool u32 = value >= 0 && value <= 0xFFFFFFFFll;
  if (k.rfind("nvlink.", 0) == 0) return SetLinkKey(d, k.substr(7), value) ? 0 : -1;
  if (k == "nvlink_links") {
    if (value < 0 || value > abi::kNvlinkMaxLinks) return -1;
    d.links.resize(value);  // new links are active with zero counters
  } else if (k == "nvlink_per_link_fields" && (value == 0 || value == 1)) {
    d.per_link_fields = value != 0;
  } else if (k == "recovery_action" && value >= -1 && value <= 0xFFFFFFFFll) {
    d.recovery_action = value;
  } else if (value < 0) {
    return -1;
  } else if (k == "ecc_corrected_volatile") {
    d.ecc[abi::kMemoryErrorCorrected][abi::kVolatileEcc] = value;
  } else if (k == "ecc_corrected_aggregate") {
    d.ecc[abi::kMemoryErrorCorrected][abi::kAggregateEcc] = value;
  } else if (k == "ecc_uncorrected_volatile") {
    d.ecc[abi::kMemoryErrorUncorrected][abi::kVolatileEcc] = value;
  } else if (k == "ecc_uncorrected_aggregate") {
    d.ecc[abi::kMemoryErrorUncorrected][abi::kAggregateEcc] = value;
  } else if (!u32) {
    return -1;
  } else if (k == "remap_correctable") {
    d.remap_corr = value;
  } else if (k == "remap_uncorrectable") {
    d.remap_unc = value;
  } else if (k == "remap_pending") {
    d.remap_pending = value;
  } else if (k == "remap_failure") {
    d.remap_failure = value;
  } else if (k == "temperature") {
    d.temperature = value;
  } else if (k == "temperature_shutdown") {
    d.shutdown = value;
  } else if (k == "temperature_slowdown") {
    d.slowdown = value;
  } else {
    return -1;
  }
  return 0;
}

FAKE_EXPORT int fake_nvml_fail(unsigned device, const char* query, int nvml_return) {
  static const std::set<std::string> kFamilies = {"ecc",          "remapped_rows",
                                                  "temperature",  "temperature_threshold",
                                                  "nvlink_state", "nvlink_error_counter",
                                                  "field_values", "register_events",
                                                  "uuid",         "name",
                                                  "pci_info",     "all"};
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (query == nullptr) return -1;
  const std::string q = query;
  if (q == "init") {
    s.init_fail = nvml_return;
    return 0;
  }
  if (device >= s.count) return -1;
  Device& d = *s.pool[device];
  if (q.rfind("field.", 0) == 0) {
    long long id = 0;
    if (!ParseLL(q.substr(6), &id) || id < 0 || id > 0xFFFFFFFFll) return -1;
    if (nvml_return == 0) d.field_fails.erase(id);
    else d.field_fails[id] = nvml_return;
    return 0;
  }
  if (kFamilies.count(q) == 0) return -1;
  if (nvml_return == 0) d.fails.erase(q);
  else d.fails[q] = nvml_return;
  return 0;
}

FAKE_EXPORT void fake_nvml_push_xid(unsigned device, unsigned long long xid) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (device >= s.count) return;
  Device* d = s.pool[device].get();
  for (EventSet* es : s.sets)
    if (es->devices.count(d)) es->queue.emplace_back(d, xid);
}

FAKE_EXPORT unsigned long long fake_nvml_calls(const char* function) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (function == nullptr) return 0;
  auto it = s.calls.find(function);
  return it == s.calls.end() ? 0 : it->second;
}

FAKE_EXPORT int fake_nvml_init_count(void) {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().init_count;
}

// ---------------------------------------------------------------- NVML functions

FAKE_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls["nvmlInit_v2"]++;
  if (s.init_fail != 0) return s.init_fail;
  s.init_count++;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlShutdown(void) {
  Count("nvmlShutdown");
  return abi::kSuccess;
}

FAKE_EXPORT const char* nvmlErrorString(nvmlReturn_t r) {
  Count("nvmlErrorString");
  switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupted request";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "Operating System Error";
    case 18: return "Library Version Mismatch";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    default: return "Unknown Error";
  }
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls["nvmlDeviceGetCount_v2"]++;
  if (count == nullptr) return abi::kErrorInvalidArgument;
  *count = s.count;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls["nvmlDeviceGetHandleByIndex_v2"]++;
  if (device == nullptr || index >= s.count) return abi::kErrorInvalidArgument;
  *device = Handle(s.pool[index].get());
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls["nvmlDeviceGetHandleByUUID"]++;
  if (uuid == nullptr || device == nullptr) return abi::kErrorInvalidArgument;
  for (unsigned i = 0; i < s.count; ++i) {
    if (s.pool[i]->uuid == uuid) {
      *device = Handle(s.pool[i].get());
      return abi::kSuccess;
    }
  }
  return abi::kErrorNotFound;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* busId, nvmlDevice_t* device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls["nvmlDeviceGetHandleByPciBusId_v2"]++;
  if (busId == nullptr || device == nullptr) return abi::kErrorInvalidArgument;
  unsigned v[4];
  const bool parsed = ParseBusId(busId, v);
  for (unsigned i = 0; i < s.count; ++i) {
    const nvmlPciInfo_t& p = s.pool[i]->pci;
    if (strcasecmp(busId, p.busId) == 0 || strcasecmp(busId, p.busIdLegacy) == 0 ||
        (parsed && v[0] == p.domain && v[1] == p.bus && v[2] == p.device && v[3] == 0)) {
      *device = Handle(s.pool[i].get());
      return abi::kSuccess;
    }
  }
  return abi::kErrorNotFound;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  Query q("nvmlDeviceGetIndex", device, "all");
  if (q.rc != 0) return q.rc;
  if (index == nullptr) return abi::kErrorInvalidArgument;
  *index = q.dev->index;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* buf, unsigned size) {
  Query q("nvmlDeviceGetUUID", device, "uuid");
  return q.rc != 0 ? q.rc : CopyString(q.dev->uuid, buf, size);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* buf, unsigned size) {
  Query q("nvmlDeviceGetName", device, "name");
  return q.rc != 0 ? q.rc : CopyString(q.dev->name, buf, size);
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  Query q("nvmlDeviceGetPciInfo_v3", device, "pci_info");
  if (q.rc != 0) return q.rc;
  if (pci == nullptr) return abi::kErrorInvalidArgument;
  *pci = q.dev->pci;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                                     unsigned long long* count) {
  Query q("nvmlDeviceGetTotalEccErrors", device, "ecc");
  if (q.rc != 0) return q.rc;
  if (count == nullptr || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
    return abi::kErrorInvalidArgument;
  *count = q.dev->ecc[errorType][counterType];
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int* corrRows, unsigned int* uncRows,
                                                   unsigned int* isPending, unsigned int* failureOccurred) {
  Query q("nvmlDeviceGetRemappedRows", device, "remapped_rows");
  if (q.rc != 0) return q.rc;
  if (!corrRows || !uncRows || !isPending || !failureOccurred) return abi::kErrorInvalidArgument;
  *corrRows = q.dev->remap_corr;
  *uncRows = q.dev->remap_unc;
  *isPending = q.dev->remap_pending;
  *failureOccurred = q.dev->remap_failure;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int* temp) {
  Query q("nvmlDeviceGetTemperature", device, "temperature");
  if (q.rc != 0) return q.rc;
  if (temp == nullptr || sensor != abi::kTemperatureGpu) return abi::kErrorInvalidArgument;
  *temp = q.dev->temperature;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int threshold, unsigned int* temp) {
  Query q("nvmlDeviceGetTemperatureThreshold", device, "temperature_threshold");
  if (q.rc != 0) return q.rc;
  if (temp == nullptr) return abi::kErrorInvalidArgument;
  if (threshold == abi::kThresholdShutdown) *temp = q.dev->shutdown;
  else if (threshold == abi::kThresholdSlowdown) *temp = q.dev->slowdown;
  else return abi::kErrorInvalidArgument;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int* isActive) {
  Query q("nvmlDeviceGetNvLinkState", device, "nvlink_state");
  if (q.rc != 0) return q.rc;
  if (q.dev->links.empty()) return abi::kErrorNotSupported;
  if (isActive == nullptr || link >= q.dev->links.size()) return abi::kErrorInvalidArgument;
  *isActive = q.dev->links[link].active ? 1 : 0;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, int counter,
                                                         unsigned long long* value) {
  Query q("nvmlDeviceGetNvLinkErrorCounter", device, "nvlink_error_counter");
  if (q.rc != 0) return q.rc;
  if (q.dev->links.empty()) return abi::kErrorNotSupported;
  if (value == nullptr || link >= q.dev->links.size()) return abi::kErrorInvalidArgument;
  const Link& l = q.dev->links[link];
  unsigned long long v = 0;
  switch (counter) {
    case abi::kNvlinkErrorReplay: v = l.replay; break;
    case abi::kNvlinkErrorRecovery: v = l.recovery; break;
    case abi::kNvlinkErrorCrcFlit: v = l.crc_flit; break;
    case abi::kNvlinkErrorCrcData: v = l.crc_data; break;
    default: return abi::kErrorInvalidArgument;
  }
  // Hopper drivers report the legacy totals as zero; the real values are per-link fields.
  *value = q.dev->per_link_fields ? 0 : v;
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t* values) {
  Query q("nvmlDeviceGetFieldValues", device, "field_values");
  if (q.rc != 0) return q.rc;
  if (valuesCount < 0 || (valuesCount > 0 && values == nullptr)) return abi::kErrorInvalidArgument;
  const Device& d = *q.dev;
  const long long now =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  for (int i = 0; i < valuesCount; ++i) {
    nvmlFieldValue_t& f = values[i];
    f.timestamp = now;
    f.latencyUsec = 0;
    f.value.ullVal = 0;
    auto ff = d.field_fails.find(f.fieldId);
    if (ff != d.field_fails.end()) {
      f.nvmlReturn = ff->second;
      continue;
    }
    f.nvmlReturn = abi::kSuccess;
    switch (f.fieldId) {
      case abi::kFieldNvlinkLinkCount:
        f.valueType = abi::kValueUnsignedInt;
        f.value.uiVal = static_cast<unsigned>(d.links.size());
        break;
      case abi::kFieldNvlinkErrorDlReplay:
      case abi::kFieldNvlinkErrorDlRecovery:
      case abi::kFieldNvlinkErrorDlCrc: {
        f.valueType = abi::kValueUnsignedLongLong;
        if (!d.per_link_fields || d.links.empty()) {
          f.nvmlReturn = abi::kErrorNotSupported;
        } else if (f.scopeId >= d.links.size()) {
          f.nvmlReturn = abi::kErrorInvalidArgument;
        } else {
          const Link& l = d.links[f.scopeId];
          if (f.fieldId == abi::kFieldNvlinkErrorDlReplay) f.value.ullVal = l.replay;
          else if (f.fieldId == abi::kFieldNvlinkErrorDlRecovery) f.value.ullVal = l.recovery;
          else f.value.ullVal = l.crc_flit + l.crc_data;
        }
        break;
      }
      case abi::kFieldGpuRecoveryAction:
        f.valueType = abi::kValueUnsignedInt;
        if (d.recovery_action < 0) f.nvmlReturn = abi::kErrorNotSupported;
        else f.value.uiVal = static_cast<unsigned>(d.recovery_action);
        break;
      default: f.nvmlReturn = abi::kErrorNotSupported;
    }
  }
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls["nvmlEventSetCreate"]++;
  if (set == nullptr) return abi::kErrorInvalidArgument;
  EventSet* es = new EventSet;
  s.sets.insert(es);
  *set = reinterpret_cast<nvmlEventSet_t>(es);
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                  nvmlEventSet_t set) {
  Query q("nvmlDeviceRegisterEvents", device, "register_events");
  if (q.rc != 0) return q.rc;
  EventSet* es = reinterpret_cast<EventSet*>(set);
  if (S().sets.count(es) == 0) return abi::kErrorInvalidArgument;
  if ((eventTypes & abi::kEventTypeXidCriticalError) == 0) return abi::kSuccess;
  if (es->devices.insert(q.dev).second)
    for (unsigned long long xid : q.dev->pending_xids) es->queue.emplace_back(q.dev, xid);
  return abi::kSuccess;
}

FAKE_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeoutms) {
  State& s = S();
  EventSet* es = reinterpret_cast<EventSet*>(set);
  std::unique_lock<std::mutex> lock(s.mu);
  s.calls["nvmlEventSetWait_v2"]++;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (data == nullptr || s.sets.count(es) == 0) return abi::kErrorInvalidArgument;
    if (!es->queue.empty()) {
      auto [dev, xid] = es->queue.front();
      es->queue.pop_front();
      *data = nvmlEventData_t{};
      data->device = Handle(dev);
      data->eventType = abi::kEventTypeXidCriticalError;
      data->eventData = xid;
      return abi::kSuccess;
    }
    if (attempt == 0 && timeoutms > 0) {  // a short nap, then one more look
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
    }
  }
  return abi::kErrorTimeout;
}

FAKE_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls["nvmlEventSetFree"]++;
  EventSet* es = reinterpret_cast<EventSet*>(set);
  if (s.sets.erase(es) == 0) return abi::kErrorInvalidArgument;
  delete es;
  return abi::kSuccess;
}

// ---------------------------------------------------------------- load-time setup

namespace {

void BadItem(const std::string& item) {
  std::fprintf(stderr, "fake_nvml: bad LMR_FAKE_NVML item '%s'\n", item.c_str());
}

void ApplyEnvironment() {
  const char* env = std::getenv("LMR_FAKE_NVML");
  if (env == nullptr) return;
  std::vector<std::string> items;
  for (std::string rest = env;;) {
    size_t semi = rest.find(';');
    std::string item = rest.substr(0, semi);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) items.push_back(item);
    if (semi == std::string::npos) break;
    rest.erase(0, semi + 1);
  }
  // "devices=N" first, since it resets everything.
  for (const std::string& item : items) {
    long long n = 0;
    if (item.rfind("devices=", 0) != 0) continue;
    if (ParseLL(item.substr(8), &n) && n >= 0 && n <= kMaxDevices) fake_nvml_reset(static_cast<unsigned>(n));
    else BadItem(item);
  }
  for (const std::string& item : items) {
    if (item.rfind("devices=", 0) == 0) continue;
    size_t dot = item.find('.'), eq = item.find('=');
    long long dev = 0, value = 0;
    if (dot == std::string::npos || eq == std::string::npos || dot > eq || !ParseLL(item.substr(0, dot), &dev) ||
        dev < 0 || dev >= kMaxDevices || !ParseLL(item.substr(eq + 1), &value)) {
      BadItem(item);
      continue;
    }
    const std::string key = item.substr(dot + 1, eq - dot - 1);
    const unsigned d = static_cast<unsigned>(dev);
    int rc = -1;
    if (key == "xid") {
      State& s = S();
      std::lock_guard<std::mutex> lock(s.mu);
      if (d < s.count && value >= 0) {
        s.pool[d]->pending_xids.push_back(static_cast<unsigned long long>(value));
        rc = 0;
      }
    } else if (key.rfind("fail.", 0) == 0) {
      if (value >= INT32_MIN && value <= INT32_MAX)
        rc = fake_nvml_fail(d, key.substr(5).c_str(), static_cast<int>(value));
    } else {
      rc = fake_nvml_set(d, key.c_str(), value);
    }
    if (rc != 0) BadItem(item);
  }
}

struct LoadTimeSetup {
  LoadTimeSetup() {
    fake_nvml_reset(2);
    ApplyEnvironment();
  }
} load_time_setup;

}  // namespace
