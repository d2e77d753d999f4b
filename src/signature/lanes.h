// Private: the order-independent lane sums behind contentCpu/contentCuda.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "mix.h"

namespace lmr::signature::detail {

// Sum of mixBlock over every 16-byte block of host memory (last block zero-padded).
Quad laneSumsCpu(const unsigned char* data, std::size_t nbytes);

// The same on CUDA device memory; see contentCuda for the stream contract.
Quad laneSumsCuda(const void* data, std::size_t nbytes, int device, void* stream);

// Lane sums of many device buffers of one CUDA device in one launch and one read-back.
struct Segment {
  const void* data = nullptr;
  std::size_t nbytes = 0;
};
std::vector<Quad> laneSumsManyCuda(const std::vector<Segment>& segments, int device, void* stream);

// A fixed list of device segments whose chunk table lives on the device (TensorSet), and
// one queued launch over it: the lane sums land in pinned memory behind an event.
struct DeviceChunks;
struct DeviceLaunch;
std::shared_ptr<DeviceChunks> uploadChunks(const std::vector<Segment>& segments, int device);
std::shared_ptr<DeviceLaunch> launchChunks(const std::shared_ptr<DeviceChunks>& table, void* stream);
bool launchReady(const DeviceLaunch& launch);
std::vector<Quad> launchWait(const DeviceLaunch& launch);  // by segment

bool cudaDevicePresent() noexcept;

}  // namespace lmr::signature::detail
