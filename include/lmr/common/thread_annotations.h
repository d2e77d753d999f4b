// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
// Under clang they let -Wthread-safety check that lock-guarded members are only touched with
// their lock held (make lint-threads); under other compilers they expand to nothing.
#pragma once

#if defined(__clang__)
#define LMR_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define LMR_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (lmr::Mutex).
#define LMR_CAPABILITY(name) LMR_THREAD_ANNOTATION(capability(name))
// An RAII type that holds a lock for its lifetime (lmr::MutexLock).
#define LMR_SCOPED_CAPABILITY LMR_THREAD_ANNOTATION(scoped_lockable)
// A member only read or written with the lock `x` held.
#define LMR_GUARDED_BY(x) LMR_THREAD_ANNOTATION(guarded_by(x))
// A pointer member whose pointee is only touched with the lock `x` held.
#define LMR_PT_GUARDED_BY(x) LMR_THREAD_ANNOTATION(pt_guarded_by(x))
// A function that must be called with the locks held.
#define LMR_REQUIRES(...) LMR_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// A function that must be called without the locks held (it takes them).
#define LMR_EXCLUDES(...) LMR_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// A function that takes / releases the locks (the lock itself, or its RAII holder).
#define LMR_ACQUIRE(...) LMR_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define LMR_RELEASE(...) LMR_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define LMR_TRY_ACQUIRE(...) LMR_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// Turns the analysis off for one function (say why beside it).
#define LMR_NO_THREAD_SAFETY_ANALYSIS LMR_THREAD_ANNOTATION(no_thread_safety_analysis)
