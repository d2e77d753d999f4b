// CPU signature throughput next to memcpy of the same buffer (run_cpu_bench.py prints the
// ratio). Buffers are larger than the last-level cache, so both are memory-bound baselines.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "lmr/signature/signature.h"

namespace {

std::vector<unsigned char>& buffer(std::size_t n) {
  static std::vector<unsigned char> data;
  if (data.size() != n) {
    data.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  }
  return data;
}

void BM_Signature(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  auto& data = buffer(n);
  for (auto _ : state) {
    auto d = lmr::signature::contentCpu(data.data(), n);
    benchmark::DoNotOptimize(d);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

void BM_Memcpy(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  auto& data = buffer(n);
  std::vector<unsigned char> out(n);
  for (auto _ : state) {
    std::memcpy(out.data(), data.data(), n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

// Interleaved so both see the same machine state.
BENCHMARK(BM_Signature)->Arg(1 << 20)->Arg(64 << 20)->Arg(256 << 20)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Memcpy)->Arg(1 << 20)->Arg(64 << 20)->Arg(256 << 20)->Unit(benchmark::kMicrosecond);

}  // namespace
