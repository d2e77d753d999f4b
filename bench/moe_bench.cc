// MoE execution-regime compression: the exact skyline of a million admitted shapes, the
// quadratic pass it replaces (at 20,000 shapes, side by side with ours), and incremental
// admission into a Catalog, with its memory.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "lmr/moe/catalog.h"

namespace {

// Token counts per expert and route, as a top-2 router over 16 layers produces them:
// roughly balanced around `mean`, with a long tail.
std::vector<lmr::moe::Shape> shapes(std::size_t n) {
  std::mt19937_64 rng(42);
  std::gamma_distribution<double> tokens(4.0, 64.0);
  std::vector<lmr::moe::Shape> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::string fingerprint = "layer";
    fingerprint += std::to_string(rng() % 16);
    fingerprint += ":bf16:4096x14336:top2";
    out.push_back({fingerprint, {static_cast<std::int64_t>(tokens(rng)), static_cast<std::int64_t>(tokens(rng))}});
  }
  return out;
}

void BM_Skyline(benchmark::State& state) {
  const auto input = shapes(static_cast<std::size_t>(state.range(0)));
  std::size_t reps = 0;
  for (auto _ : state) {
    auto out = lmr::moe::skyline(input);
    reps = out.size();
    benchmark::DoNotOptimize(out);
  }
  state.counters["representatives"] = static_cast<double>(reps);
}

void BM_SkylineNaive(benchmark::State& state) {
  const auto input = shapes(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(lmr::moe::skylineNaive(input));
}

void BM_CatalogAdmit(benchmark::State& state) {
  const auto input = shapes(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    lmr::moe::Catalog c;
    for (const auto& s : input) c.admit(s);
    state.counters["admitted"] = static_cast<double>(c.admitted());
    state.counters["representatives"] = static_cast<double>(c.representativeCount());
    state.counters["compression"] = c.compression();
    state.counters["bytes"] = static_cast<double>(c.memoryBytes());
  }
}

BENCHMARK(BM_Skyline)->Arg(20000)->Arg(1000000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SkylineNaive)->Arg(20000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CatalogAdmit)->Arg(1000000)->Unit(benchmark::kMillisecond);

}  // namespace
