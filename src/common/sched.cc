#include "lmr/common/sched.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace lmr::sched {

std::optional<ThreadTimes> threadTimes() noexcept {
  // "<cpu time ns> <run-queue wait ns> <timeslices>\n"
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  char* cpu_end = nullptr;
  const long long cpu = std::strtoll(buf, &cpu_end, 10);
  char* wait_end = nullptr;
  const long long wait = std::strtoll(cpu_end, &wait_end, 10);
  if (cpu_end == buf || wait_end == cpu_end || cpu < 0 || wait < 0) return std::nullopt;
  return ThreadTimes{static_cast<std::int64_t>(cpu), static_cast<std::int64_t>(wait)};
}

std::int64_t activeNs(std::int64_t wall_ns, const ThreadTimes& before, const ThreadTimes& after) noexcept {
  const std::int64_t cpu = std::max<std::int64_t>(0, after.cpu_ns - before.cpu_ns);
  const std::int64_t wait = std::max<std::int64_t>(0, after.wait_ns - before.wait_ns);
  return std::clamp(wall_ns - wait, std::min(cpu, wall_ns), std::max<std::int64_t>(wall_ns, 0));
}

}  // namespace lmr::sched
