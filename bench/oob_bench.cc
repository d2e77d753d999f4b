// Cost of publishing progress (lmr::oob::ProgressWriter, a seqlock over shared memory)
// against plain stores of the same fields to a shared-memory struct of the same kind; and
// of the daemons' authenticated messages (lmr/oob/wire.h) against copying the same bytes.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "lmr/oob/progress.h"
#include "lmr/oob/wire.h"

namespace {

using lmr::oob::ProgressWriter;

std::string name(const char* tag) { return lmr::oob::segmentName("bench", 0, ::getpid(), tag, 0); }

// The baseline: the same values stored with plain relaxed stores, no sequence counter.
struct Plain {
  std::atomic<std::int64_t> layer, layer_calls, progress_ns;
};

Plain* mapPlain(const std::string& n) {
  const int fd = ::shm_open(n.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ::ftruncate(fd, sizeof(Plain)) != 0) return nullptr;
  void* p = ::mmap(nullptr, sizeof(Plain), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ::shm_unlink(n.c_str());
  return p == MAP_FAILED ? nullptr : static_cast<Plain*>(p);
}

void BM_PublishLayer(benchmark::State& state) {
  ProgressWriter w(name("layer"), std::string(16, 'b'));
  std::int64_t i = 0;
  for (auto _ : state) w.layerEntered(i++ & 31);
}

void BM_PlainStoreLayer(benchmark::State& state) {
  Plain* p = mapPlain(name("plain"));
  std::int64_t i = 0;
  for (auto _ : state) {
    p->layer.store(i++ & 31, std::memory_order_relaxed);
    p->layer_calls.store(p->layer_calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    p->progress_ns.store(lmr::oob::nowNs(), std::memory_order_relaxed);
    benchmark::ClobberMemory();
  }
  ::munmap(p, sizeof(Plain));
}

void BM_PublishCollective(benchmark::State& state) {
  ProgressWriter w(name("collective"), std::string(16, 'c'));
  std::uint64_t seq = 0;
  for (auto _ : state) {
    w.collectiveEntered({1, 0, 0x1234, 0x5678, ++seq});
    w.collectiveExited();
  }
}

void BM_PublishDataLoaderNext(benchmark::State& state) {
  ProgressWriter w(name("loader"), std::string(16, 'd'));
  for (auto _ : state) {
    w.dataloaderBegin();
    w.dataloaderEnd();
  }
}

// A store request as the server reads it (a 64-byte value, a key like the daemons'):
// authenticated and checked, against the copy of the frame alone.
void BM_StoreRequestDecode(benchmark::State& state) {
  const std::string frame = lmr::oob::encodeRequest("job-token-0123456789abcdef", lmr::oob::kStoreSet,
                                                    "oob-0a1b2c3d4e5f/here/12/3", std::string(64, 'v'));
  for (auto _ : state) benchmark::DoNotOptimize(lmr::oob::decodeRequest("job-token-0123456789abcdef", frame));
}

void BM_StoreRequestCopy(benchmark::State& state) {
  const std::string frame = lmr::oob::encodeRequest("job-token-0123456789abcdef", lmr::oob::kStoreSet,
                                                    "oob-0a1b2c3d4e5f/here/12/3", std::string(64, 'v'));
  for (auto _ : state) benchmark::DoNotOptimize(std::string(frame));
}

// One gathered view, decoded and checked (once per member per stall round).
void BM_ViewDecode(benchmark::State& state) {
  lmr::oob::ViewRecord v;
  v.rank = 3;
  const std::string bytes = lmr::oob::encodeView("job-token-0123456789abcdef", "oob-0a1b2c3d4e5f/mesh/1/", v);
  for (auto _ : state)
    benchmark::DoNotOptimize(lmr::oob::decodeView("job-token-0123456789abcdef", "oob-0a1b2c3d4e5f/mesh/1/", bytes, 3));
}

BENCHMARK(BM_StoreRequestDecode);
BENCHMARK(BM_StoreRequestCopy);
BENCHMARK(BM_ViewDecode);
BENCHMARK(BM_PublishLayer);
BENCHMARK(BM_PlainStoreLayer);
BENCHMARK(BM_PublishCollective);
BENCHMARK(BM_PublishDataLoaderNext);

}  // namespace
