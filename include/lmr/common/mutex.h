// lmr::Mutex and lmr::MutexLock: std::mutex and a scoped lock with clang's thread-safety
// annotations (libstdc++'s std::mutex has none, so the analysis could not see it taken).
// Same behaviour and cost as std::mutex and std::unique_lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "lmr/common/thread_annotations.h"

namespace lmr {

class LMR_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() LMR_ACQUIRE() { mu_.lock(); }
  void unlock() LMR_RELEASE() { mu_.unlock(); }
  bool try_lock() LMR_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction.
class LMR_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) LMR_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() LMR_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // std::condition_variable::wait_for on the held lock: released while waiting, held again
  // when it returns (and while `stop` is evaluated). Returns stop().
  template <typename Rep, typename Period, typename Predicate>
  bool waitFor(std::condition_variable& cv, const std::chrono::duration<Rep, Period>& timeout, Predicate stop) {
    return cv.wait_for(lock_, timeout, stop);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace lmr
