// CUDA lane sums: one grid-stride pass over the bytes with 16-byte loads, a warp-shuffle
// and shared-memory reduction per CTA, and four 32-bit atomic adds per CTA (addition mod
// 2^32 is order-independent, so the result equals the CPU's). Everything is launched on
// the caller's stream; the host waits only for the 16-byte result.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "lanes.h"
#include "lmr/common/error.h"

namespace lmr::signature::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw IoError(std::string("CUDA call ") + what + " failed: " + cudaGetErrorString(status));
  }
}

__device__ __forceinline__ void reduceAndPublish(Quad acc, std::uint32_t* out) {
  for (int offset = 16; offset > 0; offset /= 2) {
    acc.x0 += __shfl_xor_sync(0xFFFFFFFFu, acc.x0, offset);
    acc.x1 += __shfl_xor_sync(0xFFFFFFFFu, acc.x1, offset);
    acc.x2 += __shfl_xor_sync(0xFFFFFFFFu, acc.x2, offset);
    acc.x3 += __shfl_xor_sync(0xFFFFFFFFu, acc.x3, offset);
  }
  __shared__ Quad warp_sums[kThreads / 32];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    Quad total{0, 0, 0, 0};
    for (int w = 0; w < kThreads / 32; ++w) addInto(total, warp_sums[w]);
    atomicAdd(out + 0, total.x0);
    atomicAdd(out + 1, total.x1);
    atomicAdd(out + 2, total.x2);
    atomicAdd(out + 3, total.x3);
  }
}

// Full 16-byte blocks [0, nblocks) of 16-byte aligned memory.
__global__ void __launch_bounds__(kThreads)
    laneSumsAligned(const uint4* __restrict__ data, std::uint64_t nblocks, std::uint32_t* out) {
  Quad acc{0, 0, 0, 0};
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * kThreads;
  std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < nblocks; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) addInto(acc, mixBlock(Quad{v[u].x, v[u].y, v[u].z, v[u].w}, i + u * stride));
  }
  for (; i < nblocks; i += stride) {
    const uint4 v = __ldcs(data + i);
    addInto(acc, mixBlock(Quad{v.x, v.y, v.z, v.w}, i));
  }
  reduceAndPublish(acc, out);
}

// Blocks [first, first + count) of memory with any alignment; bytes past nbytes read as 0.
__global__ void __launch_bounds__(kThreads)
    laneSumsBytes(const unsigned char* __restrict__ data, std::uint64_t nbytes, std::uint64_t first,
                  std::uint64_t count, std::uint32_t* out) {
  Quad acc{0, 0, 0, 0};
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * kThreads;
  for (std::uint64_t k = static_cast<std::uint64_t>(blockIdx.x) * kThreads + threadIdx.x; k < count; k += stride) {
    const std::uint64_t block = first + k;
    std::uint32_t w[4] = {0, 0, 0, 0};
    for (int b = 0; b < 16; ++b) {
      const std::uint64_t at = block * 16 + b;
      if (at < nbytes) w[b / 4] |= static_cast<std::uint32_t>(data[at]) << (8 * (b % 4));
    }
    addInto(acc, mixBlock(Quad{w[0], w[1], w[2], w[3]}, block));
  }
  reduceAndPublish(acc, out);
}

// Restores the caller's current device on every exit path.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Per host thread and device: the 16-byte device accumulator, its pinned host mirror and the
// launch shape. A call waits for its stream before returning, so one thread never has two
// uses in flight; keeping them avoids an allocation per call (stream-ordered allocations
// are returned to the driver at every synchronisation, which cost about 0.1 ms a call).
struct Scratch {
  std::uint32_t* device_sums = nullptr;
  Quad* host_sums = nullptr;
  int aligned_grid = 0;  // one full wave of laneSumsAligned
  int bytes_grid = 0;

  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    // At process exit the runtime may already be gone; nothing useful to do with an error.
    if (device_sums != nullptr) cudaFree(device_sums);
    if (host_sums != nullptr) cudaFreeHost(host_sums);
  }
};

Scratch& scratchFor(int device) {
  thread_local std::map<int, Scratch> per_device;
  Scratch& s = per_device[device];
  if (s.device_sums == nullptr) {
    int sm_count = 0;
    int aligned_per_sm = 0;
    int bytes_per_sm = 0;
    check(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&aligned_per_sm, laneSumsAligned, kThreads, 0),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bytes_per_sm, laneSumsBytes, kThreads, 0),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    s.aligned_grid = std::max(1, sm_count * aligned_per_sm);
    s.bytes_grid = std::max(1, sm_count * bytes_per_sm);
    check(cudaMallocHost(reinterpret_cast<void**>(&s.host_sums), sizeof(Quad)), "cudaMallocHost");
    check(cudaMalloc(reinterpret_cast<void**>(&s.device_sums), sizeof(Quad)), "cudaMalloc");
  }
  return s;
}

// Enough CTAs for the work, at most one full wave: every thread then loops the same number
// of times and no second, partly empty wave trails behind.
int gridFor(std::uint64_t work_items, int full_wave) {
  const std::uint64_t wanted = (work_items + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(wanted, full_wave)));
}

}  // namespace

Quad laneSumsCuda(const void* data, std::size_t nbytes, int device, void* stream_handle) {
  if (!cudaDevicePresent()) throw Unsupported("no CUDA device is visible to this process");
  DeviceGuard guard(device);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  Scratch& scratch = scratchFor(device);

  check(cudaMemsetAsync(scratch.device_sums, 0, sizeof(Quad), stream), "cudaMemsetAsync");
  const std::uint64_t full = nbytes / 16;
  const bool aligned = reinterpret_cast<std::uintptr_t>(data) % 16 == 0;
  if (aligned && full > 0) {
    laneSumsAligned<<<gridFor(full / kUnroll + 1, scratch.aligned_grid), kThreads, 0, stream>>>(
        static_cast<const uint4*>(data), full, scratch.device_sums);
    check(cudaGetLastError(), "laneSumsAligned launch");
  }
  const std::uint64_t first = aligned ? full : 0;
  const std::uint64_t count = (nbytes + 15) / 16 - first;
  if (count > 0) {
    laneSumsBytes<<<gridFor(count, scratch.bytes_grid), kThreads, 0, stream>>>(
        static_cast<const unsigned char*>(data), nbytes, first, count, scratch.device_sums);
    check(cudaGetLastError(), "laneSumsBytes launch");
  }
  check(cudaMemcpyAsync(scratch.host_sums, scratch.device_sums, sizeof(Quad), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return *scratch.host_sums;
}

bool cudaDevicePresent() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

}  // namespace lmr::signature::detail
