#include "health/nvml_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>

#include "lmr/common/error.h"
#include "lmr/common/mutex.h"

namespace lmr::health {
namespace {

Mutex g_mutex;
// Each library path is loaded and initialised once, then kept for the life of the process.
std::map<std::string, std::unique_ptr<NvmlLibrary>> g_libraries LMR_GUARDED_BY(g_mutex);

template <typename Fn>
void bind(void* handle, const char* symbol, Fn* slot, bool required, const std::string& path) {
  *slot = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*slot == nullptr && required) throw Unsupported(path + " has no " + symbol + ": not a usable NVML library");
}

std::string chosenPath(const std::string& path) {
  if (!path.empty()) return path;
  const char* env = std::getenv("LMR_NVML_LIBRARY");
  if (env != nullptr && *env != '\0') return env;
  return "libnvidia-ml.so.1";
}

}  // namespace

std::string NvmlLibrary::describe(nvmlReturn_t code) const {
  const char* text = errorString != nullptr ? errorString(code) : nullptr;
  return std::string(text != nullptr ? text : "NVML error") + " (" + std::to_string(code) + ")";
}

const NvmlLibrary& nvmlLibrary(const std::string& requested) {
  const std::string path = chosenPath(requested);
  MutexLock lock(g_mutex);
  auto found = g_libraries.find(path);
  if (found != g_libraries.end()) return *found->second;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Unsupported("cannot load NVML (" + path + "): " + (why ? why : "unknown error") +
                      "; is the NVIDIA driver installed? (set LMR_NVML_LIBRARY to its libnvidia-ml.so.1)");
  }
  auto lib = std::make_unique<NvmlLibrary>();
  lib->path = path;
  try {
    bind(handle, "nvmlInit_v2", &lib->init, true, path);
    bind(handle, "nvmlErrorString", &lib->errorString, true, path);
    bind(handle, "nvmlDeviceGetCount_v2", &lib->deviceGetCount, true, path);
    bind(handle, "nvmlDeviceGetHandleByIndex_v2", &lib->deviceGetHandleByIndex, true, path);
    bind(handle, "nvmlDeviceGetUUID", &lib->deviceGetUuid, true, path);
    bind(handle, "nvmlDeviceGetName", &lib->deviceGetName, true, path);
    bind(handle, "nvmlDeviceGetPciInfo_v3", &lib->deviceGetPciInfo, true, path);
    bind(handle, "nvmlDeviceGetIndex", &lib->deviceGetIndex, true, path);
    bind(handle, "nvmlDeviceGetHandleByUUID", &lib->deviceGetHandleByUuid, false, path);
    bind(handle, "nvmlDeviceGetHandleByPciBusId_v2", &lib->deviceGetHandleByPciBusId, false, path);
    bind(handle, "nvmlDeviceGetTotalEccErrors", &lib->deviceGetTotalEccErrors, false, path);
    bind(handle, "nvmlDeviceGetRemappedRows", &lib->deviceGetRemappedRows, false, path);
    bind(handle, "nvmlDeviceGetTemperature", &lib->deviceGetTemperature, false, path);
    bind(handle, "nvmlDeviceGetTemperatureThreshold", &lib->deviceGetTemperatureThreshold, false, path);
    bind(handle, "nvmlDeviceGetNvLinkState", &lib->deviceGetNvLinkState, false, path);
    bind(handle, "nvmlDeviceGetNvLinkErrorCounter", &lib->deviceGetNvLinkErrorCounter, false, path);
    bind(handle, "nvmlDeviceGetFieldValues", &lib->deviceGetFieldValues, false, path);
    bind(handle, "nvmlEventSetCreate", &lib->eventSetCreate, false, path);
    bind(handle, "nvmlDeviceRegisterEvents", &lib->deviceRegisterEvents, false, path);
    bind(handle, "nvmlEventSetWait_v2", &lib->eventSetWait, false, path);
    bind(handle, "nvmlEventSetFree", &lib->eventSetFree, false, path);
  } catch (...) {
    dlclose(handle);
    throw;
  }
  const nvmlReturn_t rc = lib->init();
  if (rc != nvml_abi::kSuccess) {
    const std::string what = lib->describe(rc);
    dlclose(handle);  // not initialised: safe to unload, and the next call tries again
    throw IoError("nvmlInit_v2 failed: " + what);
  }
  return *(g_libraries[path] = std::move(lib));
}

nvmlDevice_t nvmlHandle(const NvmlLibrary& lib, unsigned index) {
  unsigned count = 0;
  nvmlReturn_t rc = lib.deviceGetCount(&count);
  if (rc != nvml_abi::kSuccess) throw IoError("nvmlDeviceGetCount_v2 failed: " + lib.describe(rc));
  if (index >= count)
    throw InvalidArgument("NVML device index " + std::to_string(index) + " does not exist (NVML sees " +
                          std::to_string(count) + " device" + (count == 1 ? "" : "s") + ")");
  nvmlDevice_t device = nullptr;
  rc = lib.deviceGetHandleByIndex(index, &device);
  if (rc != nvml_abi::kSuccess)
    throw IoError("NVML device " + std::to_string(index) +
                  (rc == nvml_abi::kErrorGpuIsLost ? " is lost" : " cannot be opened") +
                  ": nvmlDeviceGetHandleByIndex_v2: " + lib.describe(rc));
  return device;
}

}  // namespace lmr::health
