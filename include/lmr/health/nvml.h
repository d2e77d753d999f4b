// NvmlSource: GPU health readings from NVML, loaded with dlopen at first use (no link-time
// dependency on the driver) and initialised once per process under a mutex. NVML is never
// shut down: other libraries in the process (NCCL, torch) may share it.
//
// Readings per poll (metric names in health/source.h): ECC corrected/uncorrected, volatile
// and aggregate; remapped rows (correctable, uncorrectable, pending, failure); NVLink CRC
// (flit and data where the device splits them), replay and recovery errors summed over the
// device's links, and how many links are active; GPU temperature with its shutdown and
// slowdown limits; the GPU recovery action where the driver has that field; XIDs seen since
// the last poll through an NVML event set; device_lost when NVML says the GPU is lost or
// every query of a poll fails. A metric the device does not support is reported once in
// PollResult::unsupported and not queried again.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lmr/health/source.h"

namespace lmr::health {

struct NvmlOptions {
  // Library to open. Empty: $LMR_NVML_LIBRARY if set, else "libnvidia-ml.so.1". Each path
  // is opened and initialised once per process.
  std::string library_path;
  bool xid_events = true;  // register for XID events (needs permission on some systems)
};

// Throws lmr::Unsupported when the library cannot be opened or lacks a required function,
// lmr::IoError when nvmlInit fails.
unsigned nvmlDeviceCount(const NvmlOptions& options = {});
DeviceInfo nvmlDeviceInfo(unsigned index, const NvmlOptions& options = {});
// The physical NVML index of a device named by UUID (a unique prefix is enough, as
// CUDA_VISIBLE_DEVICES accepts) or by PCI bus id. Throws InvalidArgument when none matches.
unsigned nvmlIndexByUuid(const std::string& uuid, const NvmlOptions& options = {});
unsigned nvmlIndexByPciBusId(const std::string& pci_bus_id, const NvmlOptions& options = {});

// One entry of CUDA_VISIBLE_DEVICES, for the CUDA ordinal that selects it.
struct VisibleDevice {
  enum class Kind { kIndex, kUuid } kind = Kind::kIndex;
  unsigned index = 0;  // kIndex: CUDA's enumeration index
  std::string uuid;    // kUuid: "GPU-..." (possibly a prefix)
};
// Parses `visible` (the variable's value; unset and empty differ: pass has_visible=false
// when unset) for CUDA ordinal `ordinal`, with CUDA's rules: entries up to the first invalid
// one count. Throws InvalidArgument for an ordinal past the visible list, Unsupported for
// MIG instances.
VisibleDevice parseVisibleDevice(const std::string& visible, bool has_visible, int ordinal);

// The physical NVML index behind a CUDA ordinal. With pci_bus_id (what the CUDA runtime
// reports for the ordinal) the answer is exact. Otherwise CUDA_VISIBLE_DEVICES is read: a
// UUID entry is exact; an index entry is exact under CUDA_DEVICE_ORDER=PCI_BUS_ID or when
// every GPU is the same model (CUDA then orders by PCI bus id too), and InvalidArgument is
// thrown otherwise, saying what to pass instead.
unsigned nvmlIndexForCudaOrdinal(int ordinal, const std::string& pci_bus_id = "", const NvmlOptions& options = {});

class NvmlSource : public Source {
 public:
  // Throws as nvmlDeviceCount does, and InvalidArgument for an index NVML does not have.
  explicit NvmlSource(unsigned index, NvmlOptions options = {});
  ~NvmlSource() override;

  std::string name() const override;
  PollResult poll() override;
  const DeviceInfo& device() const { return device_; }
  // Every metric found unsupported so far.
  std::vector<UnsupportedMetric> unsupported() const;

 private:
  struct State;
  DeviceInfo device_;
  std::unique_ptr<State> state_;
};

}  // namespace lmr::health
