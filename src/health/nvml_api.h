// The subset of the NVML C ABI that NvmlSource calls, declared here so that liblmr needs
// no NVML header or library at build time (the library is opened with dlopen at run time).
// Types and values follow the public nvml.h; only what we call is declared. The fake NVML
// used by the tests (tests/cpp/health/fake_nvml.cc) implements exactly these functions.
#pragma once

#include <cstdint>

extern "C" {

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;

// nvmlPciInfo_t (v3 layout).
typedef struct {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

typedef union {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  signed int siVal;
  unsigned short usVal;
} nvmlValue_t;

typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;  // the NVLink link for per-link fields
  long long timestamp;
  long long latencyUsec;
  int valueType;    // nvmlValueType_t
  int nvmlReturn;   // nvmlReturn_t of this field
  nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the XID for nvmlEventTypeXidCriticalError
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

}  // extern "C"

namespace lmr::health::nvml_abi {

constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kErrorInvalidArgument = 2;
constexpr nvmlReturn_t kErrorNotSupported = 3;
constexpr nvmlReturn_t kErrorNoPermission = 4;
constexpr nvmlReturn_t kErrorNotFound = 6;
constexpr nvmlReturn_t kErrorTimeout = 10;
constexpr nvmlReturn_t kErrorFunctionNotFound = 13;
constexpr nvmlReturn_t kErrorGpuIsLost = 15;
constexpr nvmlReturn_t kErrorUnknown = 999;

constexpr int kMemoryErrorCorrected = 0;
constexpr int kMemoryErrorUncorrected = 1;
constexpr int kVolatileEcc = 0;
constexpr int kAggregateEcc = 1;

constexpr int kTemperatureGpu = 0;
constexpr int kThresholdShutdown = 0;
constexpr int kThresholdSlowdown = 1;

constexpr int kNvlinkErrorReplay = 0;
constexpr int kNvlinkErrorRecovery = 1;
constexpr int kNvlinkErrorCrcFlit = 2;
constexpr int kNvlinkErrorCrcData = 3;
constexpr unsigned kNvlinkMaxLinks = 36;

constexpr int kValueDouble = 0;
constexpr int kValueUnsignedInt = 1;
constexpr int kValueUnsignedLong = 2;
constexpr int kValueUnsignedLongLong = 3;
constexpr int kValueSignedLongLong = 4;
constexpr int kValueSignedInt = 5;
constexpr int kValueUnsignedShort = 6;

// Field ids (nvmlDeviceGetFieldValues).
constexpr unsigned kFieldNvlinkLinkCount = 91;
constexpr unsigned kFieldNvlinkErrorDlReplay = 161;    // per link (scopeId), Hopper and later
constexpr unsigned kFieldNvlinkErrorDlRecovery = 162;  // per link
constexpr unsigned kFieldNvlinkErrorDlCrc = 163;       // per link
constexpr unsigned kFieldGpuRecoveryAction = 230;

constexpr unsigned long long kEventTypeXidCriticalError = 0x8;

constexpr unsigned kUuidBufferSize = 96;
constexpr unsigned kNameBufferSize = 96;

}  // namespace lmr::health::nvml_abi
