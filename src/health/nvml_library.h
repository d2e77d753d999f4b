// The NVML function table: the library opened with dlopen and nvmlInit_v2 called once per
// process, under a mutex. Private to src/health.
#pragma once

#include <string>

#include "health/nvml_api.h"

namespace lmr::health {

struct NvmlLibrary {
  std::string path;
  // Required: loading fails without them.
  nvmlReturn_t (*init)() = nullptr;
  const char* (*errorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*deviceGetCount)(unsigned*) = nullptr;
  nvmlReturn_t (*deviceGetHandleByIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*deviceGetUuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*deviceGetName)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*deviceGetPciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*deviceGetIndex)(nvmlDevice_t, unsigned*) = nullptr;
  // Optional: a missing one makes its metrics unsupported.
  nvmlReturn_t (*deviceGetHandleByUuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*deviceGetHandleByPciBusId)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*deviceGetTotalEccErrors)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*deviceGetRemappedRows)(nvmlDevice_t, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*deviceGetTemperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*deviceGetTemperatureThreshold)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*deviceGetNvLinkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*deviceGetNvLinkErrorCounter)(nvmlDevice_t, unsigned, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*deviceGetFieldValues)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;
  nvmlReturn_t (*eventSetCreate)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*deviceRegisterEvents)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*eventSetWait)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
  nvmlReturn_t (*eventSetFree)(nvmlEventSet_t) = nullptr;

  // "Not Supported (3)".
  std::string describe(nvmlReturn_t code) const;
};

// The NVML at `path` (empty: $LMR_NVML_LIBRARY, else libnvidia-ml.so.1), loaded and
// initialised on the first call for that path and kept for the life of the process. Throws
// Unsupported (library or a required symbol missing) or IoError (nvmlInit failed; retried on
// the next call).
const NvmlLibrary& nvmlLibrary(const std::string& path);

// The handle of a physical index; throws InvalidArgument when NVML has no such device.
nvmlDevice_t nvmlHandle(const NvmlLibrary& lib, unsigned index);

}  // namespace lmr::health
