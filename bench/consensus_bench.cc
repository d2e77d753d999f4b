// Cost of the C3 decisions themselves, per call, at typical and large peer counts.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "lmr/consensus/consensus.h"

namespace {

void BM_ExactDecision(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<std::string> evidence(n, std::string(16, 'a'));
  evidence[n / 2][3] = 'b';
  for (auto _ : state) benchmark::DoNotOptimize(lmr::consensus::exact(evidence));
}

void BM_TimingDecision(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<double> t(n, 0.1);
  t[n / 2] = 0.3;
  for (auto _ : state) benchmark::DoNotOptimize(lmr::consensus::timing(t));
}

BENCHMARK(BM_ExactDecision)->Arg(8)->Arg(64)->Arg(1024);
BENCHMARK(BM_TimingDecision)->Arg(8)->Arg(64)->Arg(1024);

}  // namespace
