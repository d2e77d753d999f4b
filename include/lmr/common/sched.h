// What the scheduler did to the calling thread, for timing that host noise does not skew.
//
// On an oversubscribed host a thread's wall time includes stretches where it was ready to
// run but another process had the core. Linux counts those per thread (schedstat's
// run-queue wait). Wall time minus that wait keeps the time the thread computed and the
// time it chose to wait (a sleep, a blocking call), and drops the preemption. The wait is
// stamped with the scheduler's clock, which can lag by a tick, so a short interval's wait
// may come out a few milliseconds too large: clamp what is left at the thread's CPU time.
// Thread-safe; no locks; one read of /proc/thread-self/schedstat (a few microseconds).
#pragma once

#include <cstdint>
#include <optional>

namespace lmr::sched {

struct ThreadTimes {
  std::int64_t cpu_ns = 0;   // time on a CPU since the thread started
  std::int64_t wait_ns = 0;  // time runnable but not running since the thread started
};

// The calling thread's counters; nullopt where the kernel does not report them (no
// /proc/thread-self/schedstat).
std::optional<ThreadTimes> threadTimes() noexcept;

// The time an interval of `wall_ns` counts once the scheduler's share is taken out:
// wall - wait, no less than the CPU time and no more than the wall time.
std::int64_t activeNs(std::int64_t wall_ns, const ThreadTimes& before, const ThreadTimes& after) noexcept;

}  // namespace lmr::sched
