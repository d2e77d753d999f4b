// Private: the order-independent lane sums behind contentCpu/contentCuda.
#pragma once

#include <cstddef>
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

bool cudaDevicePresent() noexcept;

}  // namespace lmr::signature::detail
