// NvmlSource and the NVML device lookups (see include/lmr/health/nvml.h).
#include "lmr/health/nvml.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "health/nvml_library.h"
#include "health/nvml_state.h"
#include "lmr/common/error.h"
#include "lmr/common/log.h"

namespace lmr::health {
namespace abi = nvml_abi;

namespace {

DeviceInfo readInfo(const NvmlLibrary& lib, nvmlDevice_t handle, unsigned index) {
  DeviceInfo info;
  info.index = static_cast<int>(index);
  char text[abi::kUuidBufferSize] = {};
  if (lib.deviceGetUuid(handle, text, sizeof text) == abi::kSuccess) info.uuid = text;
  char name[abi::kNameBufferSize] = {};
  if (lib.deviceGetName(handle, name, sizeof name) == abi::kSuccess) info.name = name;
  nvmlPciInfo_t pci{};
  if (lib.deviceGetPciInfo(handle, &pci) == abi::kSuccess) info.pci_bus_id = pci.busId;
  return info;
}

// (domain, bus, device) of "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F" or "BB:DD.F"; false if malformed.
bool parsePciBusId(const std::string& text, unsigned long* domain, unsigned long* bus, unsigned long* device) {
  unsigned long parts[3] = {0, 0, 0};
  int count = 0;
  std::size_t start = 0;
  const std::size_t dot = text.find('.');
  const std::string head = text.substr(0, dot);
  while (count < 3) {
    const std::size_t colon = head.find(':', start);
    const std::string piece = head.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    char* end = nullptr;
    if (piece.empty()) return false;
    parts[count++] = std::strtoul(piece.c_str(), &end, 16);
    if (*end != '\0') return false;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (count == 2) {
    *domain = 0, *bus = parts[0], *device = parts[1];
  } else if (count == 3) {
    *domain = parts[0], *bus = parts[1], *device = parts[2];
  } else {
    return false;
  }
  return true;
}

}  // namespace

unsigned nvmlDeviceCount(const NvmlOptions& options) {
  const NvmlLibrary& lib = nvmlLibrary(options.library_path);
  unsigned count = 0;
  const nvmlReturn_t rc = lib.deviceGetCount(&count);
  if (rc != abi::kSuccess) throw IoError("nvmlDeviceGetCount_v2 failed: " + lib.describe(rc));
  return count;
}

DeviceInfo nvmlDeviceInfo(unsigned index, const NvmlOptions& options) {
  const NvmlLibrary& lib = nvmlLibrary(options.library_path);
  return readInfo(lib, nvmlHandle(lib, index), index);
}

unsigned nvmlIndexByUuid(const std::string& uuid, const NvmlOptions& options) {
  if (uuid.empty()) throw InvalidArgument("GPU UUID is empty");
  const unsigned count = nvmlDeviceCount(options);
  std::vector<unsigned> matches;
  for (unsigned i = 0; i < count; ++i)
    if (nvmlDeviceInfo(i, options).uuid.rfind(uuid, 0) == 0) matches.push_back(i);
  if (matches.size() == 1) return matches[0];
  throw InvalidArgument(matches.empty() ? "no GPU has UUID " + uuid : "UUID prefix " + uuid + " matches several GPUs");
}

unsigned nvmlIndexByPciBusId(const std::string& pci_bus_id, const NvmlOptions& options) {
  unsigned long domain, bus, device;
  if (!parsePciBusId(pci_bus_id, &domain, &bus, &device))
    throw InvalidArgument("not a PCI bus id: '" + pci_bus_id + "' (expected DDDDDDDD:BB:DD.F)");
  const unsigned count = nvmlDeviceCount(options);
  for (unsigned i = 0; i < count; ++i) {
    unsigned long d2, b2, v2;
    const std::string id = nvmlDeviceInfo(i, options).pci_bus_id;
    if (parsePciBusId(id, &d2, &b2, &v2) && d2 == domain && b2 == bus && v2 == device) return i;
  }
  throw InvalidArgument("no GPU at PCI bus id " + pci_bus_id);
}

VisibleDevice parseVisibleDevice(const std::string& visible, bool has_visible, int ordinal) {
  if (ordinal < 0) throw InvalidArgument("CUDA ordinal must be >= 0, got " + std::to_string(ordinal));
  if (!has_visible) return VisibleDevice{VisibleDevice::Kind::kIndex, static_cast<unsigned>(ordinal), ""};
  std::vector<VisibleDevice> entries;
  std::size_t start = 0;
  while (start <= visible.size()) {
    const std::size_t comma = visible.find(',', start);
    std::string entry = visible.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (!entry.empty() && std::all_of(entry.begin(), entry.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      entries.push_back(VisibleDevice{VisibleDevice::Kind::kIndex, static_cast<unsigned>(std::stoul(entry)), ""});
    } else if (entry.rfind("GPU-", 0) == 0) {
      entries.push_back(VisibleDevice{VisibleDevice::Kind::kUuid, 0, entry});
    } else if (entry.rfind("MIG-", 0) == 0) {
      if (static_cast<int>(entries.size()) == ordinal)
        throw Unsupported("CUDA ordinal " + std::to_string(ordinal) + " is MIG instance " + entry +
                          ": pass the parent GPU's NVML index");
      entries.push_back(VisibleDevice{VisibleDevice::Kind::kUuid, 0, entry});
    } else {
      break;  // CUDA ignores this entry and everything after it
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (ordinal >= static_cast<int>(entries.size()))
    throw InvalidArgument("CUDA ordinal " + std::to_string(ordinal) + " is not visible (CUDA_VISIBLE_DEVICES='" +
                          visible + "' names " + std::to_string(entries.size()) + " device(s))");
  return entries[ordinal];
}

unsigned nvmlIndexForCudaOrdinal(int ordinal, const std::string& pci_bus_id, const NvmlOptions& options) {
  if (!pci_bus_id.empty()) return nvmlIndexByPciBusId(pci_bus_id, options);
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  const VisibleDevice entry = parseVisibleDevice(env ? env : "", env != nullptr, ordinal);
  if (entry.kind == VisibleDevice::Kind::kUuid) return nvmlIndexByUuid(entry.uuid, options);
  const unsigned count = nvmlDeviceCount(options);
  if (entry.index >= count)
    throw InvalidArgument("CUDA device " + std::to_string(entry.index) + " does not exist (NVML sees " +
                          std::to_string(count) + ")");
  const char* order = std::getenv("CUDA_DEVICE_ORDER");
  if (order != nullptr && std::string(order) == "PCI_BUS_ID") return entry.index;
  const std::string first = count ? nvmlDeviceInfo(0, options).name : "";
  for (unsigned i = 1; i < count; ++i)
    if (nvmlDeviceInfo(i, options).name != first)
      throw InvalidArgument(
          "GPUs of different models: CUDA's default order (fastest first) may differ from NVML's; "
          "pass the device's PCI bus id or set CUDA_DEVICE_ORDER=PCI_BUS_ID");
  return entry.index;
}

// ---------------------------------------------------------------------------------------

NvmlSource::NvmlSource(unsigned index, NvmlOptions options) : state_(std::make_unique<State>()) {
  state_->lib = &nvmlLibrary(options.library_path);
  state_->options = std::move(options);
  state_->handle = nvmlHandle(*state_->lib, index);
  device_ = readInfo(*state_->lib, state_->handle, index);
}

NvmlSource::~NvmlSource() {
  if (state_ && state_->events != nullptr && state_->lib->eventSetFree != nullptr)
    state_->lib->eventSetFree(state_->events);
}

std::string NvmlSource::name() const { return "nvml:" + std::to_string(device_.index); }

std::vector<UnsupportedMetric> NvmlSource::unsupported() const {
  MutexLock lock(state_->mutex);
  return state_->unsupported;
}

PollResult NvmlSource::poll() {
  PollResult result;
  State& s = *state_;
  MutexLock lock(s.mutex);
  s.out = &result;
  s.device = &device_;
  s.attempted = s.failed = 0;
  s.lost = false;
  s.failures.clear();
  s.readEcc();
  s.readRemap();
  s.readTemperature();
  s.readFields();
  s.readXids();
  // Lost: NVML says so, or every query failed in kAllFailedPolls polls in a row (one driver
  // timeout is not a lost GPU).
  constexpr int kAllFailedPolls = 3;
  s.all_failed_polls = s.attempted > 0 && s.failed == s.attempted ? s.all_failed_polls + 1 : 0;
  if (s.lost || s.all_failed_polls >= kAllFailedPolls) {
    s.add(metric::kDeviceLost, 1,
          s.lost
              ? "NVML: GPU is lost (" + s.failures + ")"
              : "every NVML query failed in " + std::to_string(s.all_failed_polls) + " polls in a row: " + s.failures);
  } else {
    s.add(metric::kDeviceLost, 0);
    if (s.failed > 0) LMR_LOG(kWarn, "health", name(), ": some NVML queries failed: ", s.failures);
  }
  ++s.polls;
  s.out = nullptr;
  return result;
}

}  // namespace lmr::health
