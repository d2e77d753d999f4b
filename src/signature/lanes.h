// Private: the order-independent lane sums behind contentCpu/contentCuda.
#pragma once

#include <cstddef>

#include "mix.h"

namespace lmr::signature::detail {

// Sum of mixBlock over every 16-byte block of host memory (last block zero-padded).
Quad laneSumsCpu(const unsigned char* data, std::size_t nbytes);

// The same on CUDA device memory; see contentCuda for the stream contract.
Quad laneSumsCuda(const void* data, std::size_t nbytes, int device, void* stream);

bool cudaDevicePresent() noexcept;

}  // namespace lmr::signature::detail
