// CUDA lane sums: one grid-stride pass over the bytes with 16-byte loads, a warp-shuffle
// and shared-memory reduction per CTA, and four 32-bit atomic adds per CTA (addition mod
// 2^32 is order-independent, so the result equals the CPU's). Everything is launched on
// the caller's stream; the host waits only for the 16-byte result.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

// `overwrite`: the grid is one CTA, which stores its sums (no zeroing launch needed first).
__device__ __forceinline__ void reduceAndPublish(Quad acc, std::uint32_t* out, bool overwrite = false) {
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
    if (overwrite) {
      out[0] = total.x0;
      out[1] = total.x1;
      out[2] = total.x2;
      out[3] = total.x3;
      return;
    }
    atomicAdd(out + 0, total.x0);
    atomicAdd(out + 1, total.x1);
    atomicAdd(out + 2, total.x2);
    atomicAdd(out + 3, total.x3);
  }
}

// Full 16-byte blocks [0, nblocks) of 16-byte aligned memory.
__global__ void __launch_bounds__(kThreads)
    laneSumsAligned(const uint4* __restrict__ data, std::uint64_t nblocks, std::uint32_t* out, bool overwrite) {
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
  reduceAndPublish(acc, out, overwrite);
}

// Blocks [first, first + count) of memory with any alignment; bytes past nbytes read as 0.
__global__ void __launch_bounds__(kThreads)
    laneSumsBytes(const unsigned char* __restrict__ data, std::uint64_t nbytes, std::uint64_t first,
                  std::uint64_t count, std::uint32_t* out, bool overwrite) {
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
  reduceAndPublish(acc, out, overwrite);
}

// One CTA's share of a multi-tensor call: blocks [first, first + count) of one tensor, read
// as uint4 when the tensor is 16-byte aligned, else byte by byte (bytes past nbytes are 0).
struct Chunk {
  const unsigned char* data;
  std::uint64_t nbytes;
  std::uint64_t first;
  std::uint64_t count;
  std::uint32_t tensor;
  std::uint32_t aligned;
};

// Every tensor's blocks cut into chunks of at most kChunkBlocks, one CTA each: small
// tensors take one CTA, large ones many, all in one launch. Each CTA adds its lane sums
// into its tensor's four accumulators.
constexpr std::uint64_t kChunkBlocks = std::uint64_t{kThreads} * 64;  // 256 KiB a CTA

__global__ void __launch_bounds__(kThreads) laneSumsChunks(const Chunk* __restrict__ chunks, std::uint32_t* out) {
  const Chunk c = chunks[blockIdx.x];
  Quad acc{0, 0, 0, 0};
  if (c.aligned) {
    const uint4* blocks = reinterpret_cast<const uint4*>(c.data);
    std::uint64_t k = threadIdx.x;
    for (; k + (kUnroll - 1) * kThreads < c.count; k += kUnroll * kThreads) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(blocks + c.first + k + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        addInto(acc, mixBlock(Quad{v[u].x, v[u].y, v[u].z, v[u].w}, c.first + k + u * kThreads));
    }
    for (; k < c.count; k += kThreads) {
      const std::uint64_t i = c.first + k;
      const uint4 v = __ldcs(blocks + i);
      addInto(acc, mixBlock(Quad{v.x, v.y, v.z, v.w}, i));
    }
  } else {
    for (std::uint64_t k = threadIdx.x; k < c.count; k += kThreads) {
      const std::uint64_t block = c.first + k;
      std::uint32_t w[4] = {0, 0, 0, 0};
      for (int b = 0; b < 16; ++b) {
        const std::uint64_t at = block * 16 + b;
        if (at < c.nbytes) w[b / 4] |= static_cast<std::uint32_t>(c.data[at]) << (8 * (b % 4));
      }
      addInto(acc, mixBlock(Quad{w[0], w[1], w[2], w[3]}, block));
    }
  }
  reduceAndPublish(acc, out + 4 * static_cast<std::uint64_t>(c.tensor));
}

// Restores the caller's current device on every exit path.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

// Per host thread and device: the 16-byte device accumulator, its pinned host mirror (mapped:
// a one-CTA call stores its sums straight into it, with no copy back) and the launch shape. A call waits for its stream
// before returning, so one thread never has two uses in flight; keeping them avoids an allocation per call
// (stream-ordered allocations are returned to the driver at every synchronisation, which cost about 0.1 ms a call).
struct Scratch {
  std::uint32_t* device_sums = nullptr;
  Quad* host_sums = nullptr;
  std::uint32_t* mapped_sums = nullptr;  // host_sums as the device addresses it
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
    check(cudaHostAlloc(reinterpret_cast<void**>(&s.host_sums), sizeof(Quad), cudaHostAllocMapped), "cudaHostAlloc");
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s.mapped_sums), s.host_sums, 0),
          "cudaHostGetDevicePointer");
    check(cudaMalloc(reinterpret_cast<void**>(&s.device_sums), sizeof(Quad)), "cudaMalloc");
  }
  return s;
}

// The multi-tensor call's buffers, per host thread and device.
struct ManyScratch {
  void* host = nullptr;  // pinned
  void* device = nullptr;
  std::size_t capacity = 0;

  ManyScratch() = default;
  ManyScratch(const ManyScratch&) = delete;
  ManyScratch& operator=(const ManyScratch&) = delete;
  ~ManyScratch() { release(); }
  void release() {
    if (device != nullptr) cudaFree(device);
    if (host != nullptr) cudaFreeHost(host);
    device = host = nullptr;
    capacity = 0;
  }
  void reserve(std::size_t bytes) {
    if (bytes <= capacity) return;
    release();
    const std::size_t grown = std::max<std::size_t>(bytes, 64 << 10);
    check(cudaMallocHost(&host, grown), "cudaMallocHost");
    check(cudaMalloc(&device, grown), "cudaMalloc");
    capacity = grown;
  }
};

ManyScratch& manyScratchFor(int device) {
  thread_local std::map<int, ManyScratch> per_device;
  return per_device[device];
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

  const std::uint64_t full = nbytes / 16;
  const bool aligned = reinterpret_cast<std::uintptr_t>(data) % 16 == 0;
  const bool run_aligned = aligned && full > 0;
  const std::uint64_t first = aligned ? full : 0;
  const std::uint64_t count = (nbytes + 15) / 16 - first;
  const int aligned_grid = run_aligned ? gridFor(full / kUnroll + 1, scratch.aligned_grid) : 0;
  const int bytes_grid = count > 0 ? gridFor(count, scratch.bytes_grid) : 0;
  // The first kernel stores instead of adding when it is one CTA: a small tensor then costs
  // one launch and no zeroing launch. When it is also the only kernel, it stores into the
  // mapped host mirror and nothing is copied back.
  const bool first_overwrites = run_aligned ? aligned_grid == 1 : bytes_grid == 1;
  const bool direct = first_overwrites && (run_aligned ? count == 0 : true);
  std::uint32_t* sums = direct ? scratch.mapped_sums : scratch.device_sums;
  if (!first_overwrites) check(cudaMemsetAsync(sums, 0, sizeof(Quad), stream), "cudaMemsetAsync");
  if (run_aligned) {
    laneSumsAligned<<<aligned_grid, kThreads, 0, stream>>>(static_cast<const uint4*>(data), full, sums,
                                                           first_overwrites);
    check(cudaGetLastError(), "laneSumsAligned launch");
  }
  if (count > 0) {
    laneSumsBytes<<<bytes_grid, kThreads, 0, stream>>>(static_cast<const unsigned char*>(data), nbytes, first, count,
                                                       sums, first_overwrites && !run_aligned);
    check(cudaGetLastError(), "laneSumsBytes launch");
  }
  if (!direct) {
    check(cudaMemcpyAsync(scratch.host_sums, scratch.device_sums, sizeof(Quad), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return *scratch.host_sums;
}

namespace {

// Every segment's blocks cut into chunks, one CTA each (see laneSumsChunks).
std::vector<Chunk> chunksOf(const std::vector<Segment>& segments) {
  std::vector<Chunk> chunks;
  for (std::size_t t = 0; t < segments.size(); ++t) {
    const Segment& s = segments[t];
    const bool aligned = reinterpret_cast<std::uintptr_t>(s.data) % 16 == 0;
    const std::uint64_t full = aligned ? s.nbytes / 16 : 0;
    const auto bytes = static_cast<const unsigned char*>(s.data);
    for (std::uint64_t first = 0; first < full; first += kChunkBlocks)
      chunks.push_back(
          {bytes, s.nbytes, first, std::min(kChunkBlocks, full - first), static_cast<std::uint32_t>(t), 1});
    const std::uint64_t total = (s.nbytes + 15) / 16;
    for (std::uint64_t first = full; first < total; first += kChunkBlocks)
      chunks.push_back(
          {bytes, s.nbytes, first, std::min(kChunkBlocks, total - first), static_cast<std::uint32_t>(t), 0});
  }
  return chunks;
}

void launchChunkKernel(const Chunk* device_chunks, std::size_t count, std::uint32_t* device_sums, cudaStream_t stream) {
  for (std::size_t at = 0; at < count; at += 2147483647u) {  // the grid's x limit
    const auto n = static_cast<unsigned>(std::min<std::size_t>(count - at, 2147483647u));
    laneSumsChunks<<<n, kThreads, 0, stream>>>(device_chunks + at, device_sums);
    check(cudaGetLastError(), "laneSumsChunks launch");
  }
}

}  // namespace

std::vector<Quad> laneSumsManyCuda(const std::vector<Segment>& segments, int device, void* stream_handle) {
  if (!cudaDevicePresent()) throw Unsupported("no CUDA device is visible to this process");
  DeviceGuard guard(device);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  const std::vector<Chunk> chunks = chunksOf(segments);
  // The chunk table and the accumulators share one device buffer and one pinned host buffer
  // (kept per thread and device, grown when needed: the call waits for its stream before
  // returning, so a buffer is never in use twice).
  const std::size_t table = chunks.size() * sizeof(Chunk);
  const std::size_t sums = segments.size() * sizeof(Quad);
  ManyScratch& scratch = manyScratchFor(device);
  scratch.reserve(table + sums);
  std::memcpy(scratch.host, chunks.data(), table);
  auto* device_chunks = static_cast<Chunk*>(scratch.device);
  auto* device_sums = reinterpret_cast<std::uint32_t*>(static_cast<unsigned char*>(scratch.device) + table);
  check(cudaMemcpyAsync(device_chunks, scratch.host, table, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  check(cudaMemsetAsync(device_sums, 0, sums, stream), "cudaMemsetAsync");
  launchChunkKernel(device_chunks, chunks.size(), device_sums, stream);
  auto* host_sums = static_cast<unsigned char*>(scratch.host) + table;
  check(cudaMemcpyAsync(host_sums, device_sums, sums, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<Quad> out(segments.size());
  std::memcpy(out.data(), host_sums, sums);
  return out;
}

// One launch's accumulators (device), their pinned mirror and the event after the copy.
struct SumsSlot {
  std::uint32_t* device_sums = nullptr;
  Quad* host_sums = nullptr;
  cudaEvent_t done = nullptr;
  ~SumsSlot() {
    if (done != nullptr) cudaEventDestroy(done);
    if (device_sums != nullptr) cudaFree(device_sums);
    if (host_sums != nullptr) cudaFreeHost(host_sums);
  }
};

struct DeviceChunks {
  int device = 0;
  std::size_t segments = 0;
  std::size_t chunks = 0;
  Chunk* device_table = nullptr;
  std::vector<std::unique_ptr<SumsSlot>> free_slots;  // returned by finished launches
  ~DeviceChunks() {
    free_slots.clear();
    if (device_table != nullptr) cudaFree(device_table);
  }
};

struct DeviceLaunch {
  std::shared_ptr<DeviceChunks> owner;
  std::unique_ptr<SumsSlot> slot;
  ~DeviceLaunch() {
    // A launch dropped before it finished: its buffers are still being written.
    if (slot != nullptr && cudaEventSynchronize(slot->done) == cudaSuccess)
      owner->free_slots.push_back(std::move(slot));
  }
};

std::shared_ptr<DeviceChunks> uploadChunks(const std::vector<Segment>& segments, int device) {
  if (!cudaDevicePresent()) throw Unsupported("no CUDA device is visible to this process");
  DeviceGuard guard(device);
  auto out = std::make_shared<DeviceChunks>();
  out->device = device;
  out->segments = segments.size();
  const std::vector<Chunk> chunks = chunksOf(segments);
  out->chunks = chunks.size();
  if (!chunks.empty()) {
    check(cudaMalloc(reinterpret_cast<void**>(&out->device_table), chunks.size() * sizeof(Chunk)), "cudaMalloc");
    check(cudaMemcpy(out->device_table, chunks.data(), chunks.size() * sizeof(Chunk), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  return out;
}

std::shared_ptr<DeviceLaunch> launchChunks(const std::shared_ptr<DeviceChunks>& table, void* stream_handle) {
  DeviceGuard guard(table->device);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  auto launch = std::make_shared<DeviceLaunch>();
  launch->owner = table;
  if (!table->free_slots.empty()) {
    launch->slot = std::move(table->free_slots.back());
    table->free_slots.pop_back();
  } else {
    launch->slot = std::make_unique<SumsSlot>();
    const std::size_t bytes = std::max<std::size_t>(1, table->segments) * sizeof(Quad);
    check(cudaMalloc(reinterpret_cast<void**>(&launch->slot->device_sums), bytes), "cudaMalloc");
    check(cudaMallocHost(reinterpret_cast<void**>(&launch->slot->host_sums), bytes), "cudaMallocHost");
    check(cudaEventCreateWithFlags(&launch->slot->done, cudaEventDisableTiming), "cudaEventCreate");
  }
  SumsSlot& s = *launch->slot;
  const std::size_t bytes = table->segments * sizeof(Quad);
  check(cudaMemsetAsync(s.device_sums, 0, bytes, stream), "cudaMemsetAsync");
  launchChunkKernel(table->device_table, table->chunks, s.device_sums, stream);
  check(cudaMemcpyAsync(s.host_sums, s.device_sums, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaEventRecord(s.done, stream), "cudaEventRecord");
  return launch;
}

bool launchReady(const DeviceLaunch& launch) {
  const cudaError_t status = cudaEventQuery(launch.slot->done);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaEventQuery");
  return true;
}

std::vector<Quad> launchWait(const DeviceLaunch& launch) {
  check(cudaEventSynchronize(launch.slot->done), "cudaEventSynchronize");
  return std::vector<Quad>(launch.slot->host_sums, launch.slot->host_sums + launch.owner->segments);
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
