// Built instead of cuda.cu when CMake found no CUDA toolkit (or LMR_CUDA=OFF).
#include "lanes.h"
#include "lmr/common/error.h"

namespace lmr::signature::detail {
namespace {
constexpr const char* kNoCuda =
    "this build of liblmr has no CUDA support (configure with LMR_CUDA=ON on a machine with a CUDA toolkit)";
}  // namespace

Quad laneSumsCuda(const void*, std::size_t, int, void*) { throw Unsupported(kNoCuda); }

std::vector<Quad> laneSumsManyCuda(const std::vector<Segment>&, int, void*) { throw Unsupported(kNoCuda); }

struct DeviceChunks {};
struct DeviceLaunch {};

std::shared_ptr<DeviceChunks> uploadChunks(const std::vector<Segment>&, int) { throw Unsupported(kNoCuda); }
std::shared_ptr<DeviceLaunch> launchChunks(const std::shared_ptr<DeviceChunks>&, void*) { throw Unsupported(kNoCuda); }
bool launchReady(const DeviceLaunch&) { throw Unsupported(kNoCuda); }
std::vector<Quad> launchWait(const DeviceLaunch&) { throw Unsupported(kNoCuda); }

bool cudaDevicePresent() noexcept { return false; }

}  // namespace lmr::signature::detail
