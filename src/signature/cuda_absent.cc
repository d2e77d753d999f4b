// Built instead of cuda.cu when CMake found no CUDA toolkit (or LMR_CUDA=OFF).
#include "lanes.h"
#include "lmr/common/error.h"

namespace lmr::signature::detail {

Quad laneSumsCuda(const void*, std::size_t, int, void*) {
  throw Unsupported(
      "this build of liblmr has no CUDA support (configure with LMR_CUDA=ON on a machine with a CUDA toolkit)");
}

std::vector<Quad> laneSumsManyCuda(const std::vector<Segment>&, int, void*) {
  throw Unsupported(
      "this build of liblmr has no CUDA support (configure with LMR_CUDA=ON on a machine with a CUDA toolkit)");
}

bool cudaDevicePresent() noexcept { return false; }

}  // namespace lmr::signature::detail
