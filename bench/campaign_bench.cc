// Campaign schedule cost with 100,000 incidents (half `at` lists, half ranges reaching
// iteration 10^9), next to the naive schedule that asks every incident every iteration.
#include <benchmark/benchmark.h>

#include <malloc.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "lmr/campaign/schedule.h"

namespace {

using lmr::campaign::Campaign;

std::string bigManifest(int incidents) {
  std::mt19937_64 rng(7);
  std::string m = "{\"name\":\"bench\",\"seed\":3,\"incidents\":[";
  for (int i = 0; i < incidents; ++i) {
    if (i) m += ",";
    m += "{\"incident_id\":\"i" + std::to_string(i) + "\",\"trigger\":";
    if (i % 2 == 0) {
      m += "{\"at\":[";
      std::int64_t at = 1 + static_cast<std::int64_t>(rng() % 1000000);
      for (int k = 0; k < 10; ++k) {
        if (k) m += ",";
        m += std::to_string(at);
        at += 1 + static_cast<std::int64_t>(rng() % 100000000);
      }
      m += "]";
    } else {
      const std::int64_t start = 1 + static_cast<std::int64_t>(rng() % 10000000);
      const std::int64_t every = 1000000 + static_cast<std::int64_t>(rng() % 9000000);
      m += "{\"range\":{\"start\":" + std::to_string(start) + ",\"end\":1000000000,\"every\":" + std::to_string(every) +
           "}";
      m += ",\"probability\":0.5";
    }
    m += "},\"lifetime\":{\"matching_calls\":1},\"faults\":[{\"fault_id\":\"f\",\"type\":\"tensor_corruption\","
         "\"target\":{\"rank\":" +
         std::to_string(i % 64) + ",\"component\":\"transformer_block\",\"index\":" + std::to_string(i % 80) +
         ",\"surface\":\"output\"},\"parameters\":{\"operation\":\"sign_flip\"}}]}";
  }
  return m + "]}";
}

// Bytes the heap has handed out and not taken back (glibc).
std::size_t heapInUse() { return mallinfo2().uordblks; }

std::shared_ptr<const Campaign> campaign(int incidents) {
  static std::shared_ptr<const Campaign> cached;
  static int cached_n = 0;
  if (cached_n != incidents) {
    cached = std::make_shared<const Campaign>(Campaign::parse(bigManifest(incidents)));
    cached_n = incidents;
  }
  return cached;
}

void BM_ParseManifest(benchmark::State& state) {
  const std::string text = bigManifest(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(Campaign::parse(text));
  state.counters["manifest_MB"] = text.size() / 1e6;
}

// Memory held by a parsed campaign and its schedule, per incident.
void BM_ScheduleMemory(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::string text = bigManifest(n);
  double held = 0;
  for (auto _ : state) {
    const std::size_t before = heapInUse();
    auto c = std::make_shared<const Campaign>(Campaign::parse(text));
    lmr::campaign::Schedule s(c, 0, 0);
    held = static_cast<double>(heapInUse() - before);
    benchmark::DoNotOptimize(s.nextDue());
  }
  state.counters["bytes_per_incident"] = held / n;
}

// The training loop's view: one dueAt() per optimizer step. Most steps have nothing due.
void BM_ScheduleStep(benchmark::State& state) {
  auto c = campaign(100000);
  lmr::campaign::Schedule s(c, 0, 0);
  std::int64_t it = 0, due = 0;
  for (auto _ : state) {
    auto d = s.dueAt(++it);
    due += static_cast<std::int64_t>(d.size());
    benchmark::DoNotOptimize(d);
  }
  state.counters["due_per_step"] = benchmark::Counter(static_cast<double>(due) / static_cast<double>(it));
}

// Baseline: ask every incident whether this iteration is one of its candidates.
void BM_NaiveScanStep(benchmark::State& state) {
  auto c = campaign(100000);
  std::int64_t it = 0;
  for (auto _ : state) {
    ++it;
    int due = 0;
    for (const auto& inc : c->incidents()) due += inc.trigger.isCandidate(it) ? 1 : 0;
    benchmark::DoNotOptimize(due);
  }
}

BENCHMARK(BM_ParseManifest)->Arg(100000)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_ScheduleMemory)->Arg(10000)->Arg(100000)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_ScheduleStep);
BENCHMARK(BM_NaiveScanStep)->Unit(benchmark::kMicrosecond);

}  // namespace
