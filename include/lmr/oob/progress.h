// Out-of-band progress records: what a training process last did, in shared memory, for
// the lmr-oobd observer to read while the training process may be blocked.
//
// One segment per training rank. The training process is its only writer; updates take no
// lock, make no system call and allocate nothing (a seqlock over relaxed atomics, a
// vDSO clock read). Readers take a consistent snapshot by retrying while a write is in
// flight. The record has three independently sequenced sections, so the DataLoader and
// checkpoint paths may publish from other threads than the one driving the training step.
//
// Segments are named from (run, generation, process, peer group, rank) and carry an owner
// pid and a 16-byte ownership token: a writer never attaches to a live owner's segment
// and reclaims a dead owner's one.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lmr::oob {

// The public collective a rank is in (or last was in), as peers must agree on it.
struct CollectiveFingerprint {
  std::uint32_t op = 0;              // caller-defined operation code
  std::uint32_t reduce_or_root = 0;  // reduce op, or root rank
  std::uint64_t group = 0;           // digest of the process group membership
  std::uint64_t meta = 0;            // digest of fixed tensor metadata
  std::uint64_t sequence = 0;        // position in the rank's sequence of collectives
  bool operator==(const CollectiveFingerprint&) const = default;
};

struct Snapshot {
  std::uint64_t step = 0;            // optimizer steps completed
  std::uint64_t steps_here = 0;      // steps this process completed (0: its first one still runs)
  std::int64_t layer = -1;           // repeated layer last entered (-1: none this step)
  std::uint64_t layer_calls = 0;     // layer entries this step
  CollectiveFingerprint collective;  // the current or last collective
  bool in_collective = false;
  std::int64_t collective_since_ns = 0;  // when the current collective began
  std::int64_t progress_ns = 0;          // last step/layer/collective event
  std::int64_t dataloader_since_ns = 0;  // a next() in flight since (0: none)
  std::int64_t dataloader_last_ns = 0;   // duration of the last completed next()
  std::int64_t checkpoint_since_ns = 0;  // checkpoint I/O in flight since (0: none)
  std::int64_t checkpoint_last_ns = 0;   // duration of the last completed checkpoint I/O
  std::int32_t owner_pid = 0;
};

// Monotonic nanoseconds (CLOCK_MONOTONIC through the vDSO).
std::int64_t nowNs() noexcept;

// "/lmr-<24 hex>": a POSIX shared-memory name from the scoping fields.
std::string segmentName(std::string_view run_id, std::int64_t generation, std::int64_t pid, std::string_view group,
                        std::int64_t rank);

struct Shared;  // the mapped layout (private)

// The training side. Not copyable; one per segment; its methods are safe to call from the
// threads described above. Throws IoError when the segment cannot be created or mapped,
// InvalidArgument when a live process owns it.
class ProgressWriter {
 public:
  ProgressWriter(const std::string& name, const std::string& token16);
  ~ProgressWriter();  // close()

  // Unlinks the segment now; the mapping stays until destruction, so updates from hooks
  // that outlive the monitor (or race with close) land in memory nobody reads. Idempotent.
  void close() noexcept;
  ProgressWriter(const ProgressWriter&) = delete;
  ProgressWriter& operator=(const ProgressWriter&) = delete;

  // Step, layer and collective events share one section: call them from one thread at a
  // time (the autograd thread may publish while the caller blocks in backward()). A step
  // or a layer entered also ends the current collective, for collectives whose completion
  // is not visible (a DDP bucket finishes inside the reducer).
  void stepCompleted(std::uint64_t step) noexcept;
  void layerEntered(std::int64_t layer) noexcept;
  void collectiveEntered(const CollectiveFingerprint& fp) noexcept;
  void collectiveExited() noexcept;
  void dataloaderBegin() noexcept;
  void dataloaderEnd() noexcept;
  void checkpointBegin() noexcept;
  void checkpointEnd() noexcept;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  Shared* shared_ = nullptr;
  std::atomic<bool> unlinked_{false};
};

// The observer side: maps a segment read-only. snapshot() retries until it sees a
// consistent record (bounded; nullopt when a writer stays mid-update, e.g. was killed
// inside one).
class ProgressReader {
 public:
  explicit ProgressReader(const std::string& name);
  ~ProgressReader();
  ProgressReader(const ProgressReader&) = delete;
  ProgressReader& operator=(const ProgressReader&) = delete;

  std::optional<Snapshot> snapshot() const noexcept;

  // Unlinks segment `name` when its owner is `owner_pid` and that process is gone: the
  // observer's clean-up after its training process died without unlinking (also one the
  // owner died while creating, not initialised yet). True when it removed the segment.
  static bool unlinkIfOwnerDead(const std::string& name, std::int32_t owner_pid) noexcept;
  // Whether segment `name` exists (initialised or not).
  static bool exists(const std::string& name) noexcept;

 private:
  const Shared* shared_ = nullptr;
};

}  // namespace lmr::oob
