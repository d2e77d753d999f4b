// A non-owning description of a tensor's bytes, as liblmr receives them from a framework.
// The caller keeps the memory alive and unchanged for the duration of the call it passes
// the view to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lmr {

enum class DeviceType : std::uint8_t { kCpu = 0, kCuda = 1 };

// What a tensor is, apart from its bytes. dtype is the framework's name ("torch.bfloat16").
struct TensorMeta {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements, as the framework reports them
};

struct TensorView {
  const void* data = nullptr;  // first byte, in logical (row-major) order
  std::size_t nbytes = 0;
  DeviceType device = DeviceType::kCpu;
  int device_index = 0;  // CUDA ordinal when device == kCuda
  TensorMeta meta;
};

}  // namespace lmr
