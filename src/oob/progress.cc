#include "lmr/oob/progress.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "lmr/common/error.h"
#include "lmr/common/sha256.h"

namespace lmr::oob {

namespace {

constexpr std::uint32_t kMagic = 0x4C4D524F;  // "LMRO"
constexpr std::uint32_t kVersion = 2;

using A64 = std::atomic<std::int64_t>;
using AU64 = std::atomic<std::uint64_t>;

inline void beginWrite(AU64& seq) noexcept {
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

inline void endWrite(AU64& seq) noexcept {
  std::atomic_thread_fence(std::memory_order_release);
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

template <typename Read>
bool readConsistent(const AU64& seq, Read read) noexcept {
  for (int attempt = 0; attempt < 100000; ++attempt) {
    const std::uint64_t a = seq.load(std::memory_order_acquire);
    if (a & 1) continue;
    read();
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq.load(std::memory_order_relaxed) == a) return true;
  }
  return false;
}

}  // namespace

// A single-writer seqlock section of Shared.
struct alignas(64) SeqlockSection {
  std::atomic<std::uint64_t> seq{0};
};

struct Shared {
  std::atomic<std::uint32_t> magic;
  std::uint32_t version;
  std::atomic<std::int32_t> owner_pid;
  char token[16];
  SeqlockSection progress;
  AU64 step, steps_here;
  A64 layer;
  AU64 layer_calls;
  std::atomic<std::uint32_t> op, reduce_or_root;
  AU64 group, meta, sequence;
  std::atomic<std::uint32_t> in_collective;
  A64 collective_since_ns, progress_ns;
  SeqlockSection dataloader;
  A64 dataloader_since_ns, dataloader_last_ns;
  SeqlockSection checkpoint;
  A64 checkpoint_since_ns, checkpoint_last_ns;
};

std::int64_t nowNs() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string segmentName(std::string_view run_id, std::int64_t generation, std::int64_t pid, std::string_view group,
                        std::int64_t rank) {
  Sha256 h;
  h.update("lmr.oob.segment.v1");
  h.updateU64(run_id.size()).update(run_id);
  h.updateU64(static_cast<std::uint64_t>(generation)).updateU64(static_cast<std::uint64_t>(pid));
  h.updateU64(group.size()).update(group);
  h.updateU64(static_cast<std::uint64_t>(rank));
  const auto d = h.finish();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string name = "/lmr-";
  for (int i = 0; i < 12; ++i) {
    name.push_back(kHex[d[i] >> 4]);
    name.push_back(kHex[d[i] & 15]);
  }
  return name;
}

namespace {

// A process that exists and is not a zombie (an exited owner awaiting its reaper is dead).
bool alive(std::int32_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;  // no /proc: trust kill(2)
  char buffer[512] = {0};
  const std::size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buffer, ')');
  return !(n > 0 && paren != nullptr && paren[1] == ' ' && paren[2] == 'Z');
}

Shared* mapSegment(int fd, int prot) {
  void* p = ::mmap(nullptr, sizeof(Shared), prot, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<Shared*>(p);
}

}  // namespace

ProgressWriter::ProgressWriter(const std::string& name, const std::string& token16) : name_(name) {
  if (token16.size() != 16) throw InvalidArgument("an ownership token is 16 bytes");
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Someone created it: reclaim it only from a dead owner on this exact channel.
    const int existing = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (existing < 0) throw IoError("cannot open progress segment " + name + ": " + std::strerror(errno));
    struct stat st{};
    Shared* old = (::fstat(existing, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(Shared)))
                      ? mapSegment(existing, PROT_READ)
                      : nullptr;
    const std::int32_t owner = old ? old->owner_pid.load() : 0;
    const bool same_token = old && std::memcmp(old->token, token16.data(), 16) == 0;
    if (old) ::munmap(old, sizeof(Shared));
    ::close(existing);
    if (alive(owner) && !same_token) {
      throw InvalidArgument("progress segment " + name + " belongs to live process " + std::to_string(owner));
    }
    ::shm_unlink(name.c_str());
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  if (fd < 0) throw IoError("cannot create progress segment " + name + ": " + std::strerror(errno));
  if (::ftruncate(fd, sizeof(Shared)) != 0) {
    const std::string message = "cannot size progress segment " + name + ": " + std::strerror(errno);
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw IoError(message);
  }
  shared_ = mapSegment(fd, PROT_READ | PROT_WRITE);
  ::close(fd);
  if (shared_ == nullptr) {
    ::shm_unlink(name.c_str());
    throw IoError("cannot map progress segment " + name);
  }
  std::memset(static_cast<void*>(shared_), 0, sizeof(Shared));
  std::memcpy(shared_->token, token16.data(), 16);
  shared_->version = kVersion;
  shared_->layer.store(-1, std::memory_order_relaxed);
  shared_->progress_ns.store(nowNs(), std::memory_order_relaxed);
  shared_->owner_pid.store(static_cast<std::int32_t>(::getpid()));
  shared_->magic.store(kMagic, std::memory_order_release);
}

ProgressWriter::~ProgressWriter() {
  close();
  if (shared_ != nullptr) ::munmap(shared_, sizeof(Shared));
}

void ProgressWriter::close() noexcept {
  if (shared_ != nullptr && !unlinked_.exchange(true)) ::shm_unlink(name_.c_str());
}

void ProgressWriter::stepCompleted(std::uint64_t step) noexcept {
  beginWrite(shared_->progress.seq);
  shared_->step.store(step, std::memory_order_relaxed);
  shared_->steps_here.store(shared_->steps_here.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  shared_->layer.store(-1, std::memory_order_relaxed);
  shared_->layer_calls.store(0, std::memory_order_relaxed);
  shared_->in_collective.store(0, std::memory_order_relaxed);
  shared_->progress_ns.store(nowNs(), std::memory_order_relaxed);
  endWrite(shared_->progress.seq);
}

void ProgressWriter::layerEntered(std::int64_t layer) noexcept {
  beginWrite(shared_->progress.seq);
  shared_->layer.store(layer, std::memory_order_relaxed);
  shared_->layer_calls.store(shared_->layer_calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  shared_->in_collective.store(0, std::memory_order_relaxed);
  shared_->progress_ns.store(nowNs(), std::memory_order_relaxed);
  endWrite(shared_->progress.seq);
}

void ProgressWriter::collectiveEntered(const CollectiveFingerprint& fp) noexcept {
  const std::int64_t now = nowNs();
  beginWrite(shared_->progress.seq);
  shared_->op.store(fp.op, std::memory_order_relaxed);
  shared_->reduce_or_root.store(fp.reduce_or_root, std::memory_order_relaxed);
  shared_->group.store(fp.group, std::memory_order_relaxed);
  shared_->meta.store(fp.meta, std::memory_order_relaxed);
  shared_->sequence.store(fp.sequence, std::memory_order_relaxed);
  shared_->in_collective.store(1, std::memory_order_relaxed);
  shared_->collective_since_ns.store(now, std::memory_order_relaxed);
  shared_->progress_ns.store(now, std::memory_order_relaxed);
  endWrite(shared_->progress.seq);
}

void ProgressWriter::collectiveExited() noexcept {
  beginWrite(shared_->progress.seq);
  shared_->in_collective.store(0, std::memory_order_relaxed);
  shared_->progress_ns.store(nowNs(), std::memory_order_relaxed);
  endWrite(shared_->progress.seq);
}

void ProgressWriter::dataloaderBegin() noexcept {
  beginWrite(shared_->dataloader.seq);
  shared_->dataloader_since_ns.store(nowNs(), std::memory_order_relaxed);
  endWrite(shared_->dataloader.seq);
}

void ProgressWriter::dataloaderEnd() noexcept {
  const std::int64_t now = nowNs();
  beginWrite(shared_->dataloader.seq);
  shared_->dataloader_last_ns.store(now - shared_->dataloader_since_ns.load(std::memory_order_relaxed),
                                    std::memory_order_relaxed);
  shared_->dataloader_since_ns.store(0, std::memory_order_relaxed);
  endWrite(shared_->dataloader.seq);
}

void ProgressWriter::checkpointBegin() noexcept {
  beginWrite(shared_->checkpoint.seq);
  shared_->checkpoint_since_ns.store(nowNs(), std::memory_order_relaxed);
  endWrite(shared_->checkpoint.seq);
}

void ProgressWriter::checkpointEnd() noexcept {
  const std::int64_t now = nowNs();
  beginWrite(shared_->checkpoint.seq);
  shared_->checkpoint_last_ns.store(now - shared_->checkpoint_since_ns.load(std::memory_order_relaxed),
                                    std::memory_order_relaxed);
  shared_->checkpoint_since_ns.store(0, std::memory_order_relaxed);
  endWrite(shared_->checkpoint.seq);
}

ProgressReader::ProgressReader(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) throw IoError("cannot open progress segment " + name + ": " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Shared))) {
    ::close(fd);
    throw IoError("progress segment " + name + " is not initialised");
  }
  shared_ = mapSegment(fd, PROT_READ);
  ::close(fd);
  if (shared_ == nullptr) throw IoError("cannot map progress segment " + name);
  if (shared_->magic.load(std::memory_order_acquire) != kMagic || shared_->version != kVersion) {
    ::munmap(const_cast<Shared*>(shared_), sizeof(Shared));
    shared_ = nullptr;
    throw IoError("progress segment " + name + " has an unknown layout");
  }
}

ProgressReader::~ProgressReader() {
  if (shared_ != nullptr) ::munmap(const_cast<Shared*>(shared_), sizeof(Shared));
}

std::optional<Snapshot> ProgressReader::snapshot() const noexcept {
  Snapshot s;
  const Shared& m = *shared_;
  const bool ok1 = readConsistent(m.progress.seq, [&] {
    s.step = m.step.load(std::memory_order_relaxed);
    s.steps_here = m.steps_here.load(std::memory_order_relaxed);
    s.layer = m.layer.load(std::memory_order_relaxed);
    s.layer_calls = m.layer_calls.load(std::memory_order_relaxed);
    s.collective =
        CollectiveFingerprint{m.op.load(std::memory_order_relaxed), m.reduce_or_root.load(std::memory_order_relaxed),
                              m.group.load(std::memory_order_relaxed), m.meta.load(std::memory_order_relaxed),
                              m.sequence.load(std::memory_order_relaxed)};
    s.in_collective = m.in_collective.load(std::memory_order_relaxed) != 0;
    s.collective_since_ns = m.collective_since_ns.load(std::memory_order_relaxed);
    s.progress_ns = m.progress_ns.load(std::memory_order_relaxed);
  });
  const bool ok2 = readConsistent(m.dataloader.seq, [&] {
    s.dataloader_since_ns = m.dataloader_since_ns.load(std::memory_order_relaxed);
    s.dataloader_last_ns = m.dataloader_last_ns.load(std::memory_order_relaxed);
  });
  const bool ok3 = readConsistent(m.checkpoint.seq, [&] {
    s.checkpoint_since_ns = m.checkpoint_since_ns.load(std::memory_order_relaxed);
    s.checkpoint_last_ns = m.checkpoint_last_ns.load(std::memory_order_relaxed);
  });
  s.owner_pid = m.owner_pid.load(std::memory_order_relaxed);
  if (!ok1 || !ok2 || !ok3) return std::nullopt;
  return s;
}

}  // namespace lmr::oob

namespace lmr::oob {

bool ProgressReader::unlinkIfOwnerDead(const std::string& name, std::int32_t owner_pid) noexcept {
  if (alive(owner_pid)) return false;
  try {
    ProgressReader reader(name);
    if (reader.shared_->owner_pid.load() != owner_pid) return false;
  } catch (...) {
    // Absent (nothing to do: the unlink fails), or not initialised: the owner died while
    // creating it. The name is derived from the owner's pid (segmentName), so no other
    // process holds a segment of this name.
  }
  return ::shm_unlink(name.c_str()) == 0;
}

bool ProgressReader::exists(const std::string& name) noexcept {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

}  // namespace lmr::oob
