// Scale of the decision layer (issue 49, part 1): each decision of liblmr timed on synthetic
// evidence for 8 to 16,384 simulated ranks on DDP, HSDP, TP x PP x DP and EP x DP meshes, with
// one planted failure (tests/cpp/scale/: the world, the evidence, and the CI-size tests that
// the culprit is named). Counters: peers in the decision, evidence bytes one rank contributes
// (bytes_per_rank) and holds to decide (bytes_gathered). ->Complexity() fits the growth in N,
// the world size. Run: build/bench/lmr_bench --benchmark_filter=Scale (docs/scale.md).
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include "lmr/consensus/consensus.h"
#include "lmr/mesh/comm.h"
#include "lmr/moe/alltoall.h"
#include "lmr/replay/verdict.h"
#include "scale/scale_evidence.h"
#include "scale/scale_world.h"

namespace {

using lmr::scale::kCulprit;
using lmr::scale::Mesh;

void worldSizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {8, 64, 256, 1024, 4096, 16384}) b->Arg(n);
  b->Complexity()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
}

void setBytes(benchmark::State& state, double peers, double per_rank, double gathered) {
  state.counters["peers"] = peers;
  state.counters["bytes_per_rank"] = per_rank;
  state.counters["bytes_gathered"] = gathered;
}

void BM_ScaleExact(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<std::string> digests;
  for (std::int64_t r = 0; r < n; ++r) digests.push_back(lmr::scale::fingerprint("hidden.1.output", 0, r == kCulprit));
  for (auto _ : state) benchmark::DoNotOptimize(lmr::consensus::exact(digests));
  if (lmr::consensus::exact(digests).attributedRanks() != std::vector<std::int64_t>{kCulprit})
    state.SkipWithError("exact consensus did not name the culprit");
  state.SetComplexityN(n);
  setBytes(state, static_cast<double>(n), 16, 16.0 * static_cast<double>(n));
}

void BM_ScaleTiming(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<double> seconds;
  for (std::int64_t r = 0; r < n; ++r) seconds.push_back(lmr::scale::replaySeconds(r, 1, 0, r == kCulprit));
  for (auto _ : state) benchmark::DoNotOptimize(lmr::consensus::timing(seconds));
  if (lmr::consensus::timing(seconds).attributedRanks() != std::vector<std::int64_t>{kCulprit})
    state.SkipWithError("timing consensus did not name the culprit");
  state.SetComplexityN(n);
  setBytes(state, static_cast<double>(n), 8, 8.0 * static_cast<double>(n));
}

// decideCheck on the culprit's compute group (what each of its ranks runs at a check), an
// SDC source planted.
void BM_ScaleCheck(benchmark::State& state, Mesh mesh) {
  const std::int64_t n = state.range(0);
  const lmr::scale::World w = lmr::scale::makeWorld(mesh, n);
  const std::size_t g = w.compute_of[kCulprit];
  const lmr::scale::Check c = lmr::scale::checkOf(w, g, lmr::scale::Plant{.sdc = true}, 1);
  lmr::replay::StragglerTracker tracker(lmr::replay::StragglerOptions{});
  std::int64_t step = 0;
  lmr::replay::CheckVerdict v;
  for (auto _ : state) {
    v = lmr::replay::decideCheck(c.layout, ++step, c.checked, {}, c.votes, tracker);
    benchmark::DoNotOptimize(v);
  }
  for (std::size_t i = 0; i < c.layout.ranks.size(); ++i)
    if (v.sdc_bitmap[i] != (c.layout.ranks[i] == kCulprit)) state.SkipWithError("the check did not name the culprit");
  double gathered = 0, mine = 0;
  for (std::size_t i = 0; i < c.votes.size(); ++i) {
    const auto bytes = static_cast<double>(lmr::scale::voteBytes(c.votes[i]));
    gathered += bytes;
    if (c.layout.ranks[i] == kCulprit) mine = bytes;
  }
  state.SetComplexityN(n);
  setBytes(state, static_cast<double>(c.layout.ranks.size()), mine, gathered);
  state.counters["groups"] = static_cast<double>(w.compute.size());
}

// One CommTracker round (completeObservations over every rank's records, then observe),
// after two untimed rounds, so every timed round confirms the slow link at the culprit.
// `form`: how records name their group (lmr::scale::RecordForm): kSized is what
// scout/comm.py sends now, to the world's first rank, which decides and sends the verdict
// back; kTable and kInline were all-gathered, every rank deciding. Counters: what rank 5
// sends (bytes_per_rank), what the deciding rank holds (bytes_gathered) and receives (every
// rank's payload padded to the largest, as torch's object collectives pad), and what every
// other rank receives (bytes_received_other: the verdict now; the padded gather before).
void BM_ScaleComm(benchmark::State& state, Mesh mesh, lmr::scale::RecordForm form) {
  const std::int64_t n = state.range(0);
  const lmr::scale::World w = lmr::scale::makeWorld(mesh, n);
  const auto round = lmr::scale::commRound(w, 1, kCulprit, form);
  lmr::mesh::CommTracker tracker;
  std::int64_t step = 0;
  for (; step < 2; ++step) tracker.observe(step, lmr::mesh::completeObservations(round.by_rank, round.groups));
  lmr::mesh::CommVerdict v;
  double complete_s = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const auto observations = lmr::mesh::completeObservations(round.by_rank, round.groups);
    complete_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    v = tracker.observe(step++, observations);
    benchmark::DoNotOptimize(v);
  }
  if (mesh != Mesh::kDdp && (!v.rank || *v.rank != kCulprit)) state.SkipWithError(("not named: " + v.reason).c_str());
  double gathered = 0, mine = 0, largest = 0, members = 0;
  for (std::size_t r = 0; r < round.by_rank.size(); ++r) {
    double sent = static_cast<double>(round.table_bytes[r]);
    for (const auto& record : round.by_rank[r]) {
      sent += static_cast<double>(lmr::scale::recordBytes(record));
      members += static_cast<double>(record.members.size());
    }
    gathered += sent;
    largest = std::max(largest, sent);
    if (static_cast<std::int64_t>(r) == kCulprit) mine = sent;
  }
  for (const auto& [key, entry] : round.groups) members += static_cast<double>(entry.members.size());
  double verdict = 64 + static_cast<double>(v.reason.size() + 8 * v.late_ranks.size());
  for (const auto* names : {&v.slow_groups, &v.candidate_groups})
    for (const auto& g : *names) verdict += static_cast<double>(g.size());
  const double padded = largest * static_cast<double>(n);
  state.SetComplexityN(n);
  setBytes(state, static_cast<double>(n), mine, gathered);
  state.counters["bytes_received_first"] = padded;
  state.counters["bytes_received_other"] = form == lmr::scale::RecordForm::kSized ? verdict : padded;
  state.counters["members_gathered"] = members;  // member ids in the gathered records and table
  state.counters["complete_us"] =
      benchmark::Counter(complete_s * 1e6, benchmark::Counter::kAvgIterations);  // of the time above
}

// decideRouting over one expert-parallel group of `ranks` (not the world): the default policy's
// ranks + 1 matrices, a corrupting sender planted.
void BM_ScaleRouting(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<std::string> votes;
  for (std::int64_t me = 0; me < n; ++me) votes.push_back(lmr::scale::routingVoteOf(n, me, kCulprit));
  lmr::moe::RoutingVerdict v;
  for (auto _ : state) {
    v = lmr::moe::decideRouting(votes);
    benchmark::DoNotOptimize(v);
  }
  if (!v.bitmap[kCulprit] || v.status != lmr::consensus::Status::kAttributed)
    state.SkipWithError("routing did not name the culprit");
  state.SetComplexityN(n);
  const double vote = static_cast<double>(votes[0].size());
  setBytes(state, static_cast<double>(n), vote, vote * static_cast<double>(n));
}

// One stall round's decision, as every leading daemon of an N-rank peer group runs it:
// diagnose over the N views, then the report's JSON (what the daemons write and the store
// carries). The counters add the round's store traffic and sockets, counted from the
// protocol (lmr::scale::oobRoundCost), not measured: one daemon per host (`_1l`, a
// one-level round) and eight (`_2l`), and eight as the round was before the leaders met in a
// ring and two of them decided their list (`_2l_full_mesh`). BM_OobRound (oob_round_bench.cc) runs real rounds.
void BM_ScaleDiagnose(benchmark::State& state, lmr::scale::Stall stall) {
  const std::int64_t n = state.range(0);
  const auto views = lmr::scale::stallViews(n, stall, kCulprit);
  lmr::oob::FaultReport report;
  std::size_t report_bytes = 0;
  for (auto _ : state) {
    report = lmr::oob::diagnose(views);
    report_bytes = lmr::oob::toJson(report).dump().size();
    benchmark::DoNotOptimize(report_bytes);
  }
  if (report.ranks != std::vector<std::int64_t>{kCulprit}) state.SkipWithError(("not named: " + report.kind).c_str());
  state.SetComplexityN(n);
  setBytes(state, static_cast<double>(n), static_cast<double>(lmr::oob::kViewBytes),
           static_cast<double>(lmr::oob::kViewBytes) * static_cast<double>(n));
  state.counters["report_bytes"] = static_cast<double>(report_bytes);
  for (const auto& [suffix, per_host, ring] :
       {std::tuple{"_1l", 1, true}, std::tuple{"_2l", 8, true}, std::tuple{"_2l_full_mesh", 8, false}}) {
    const auto cost = ring ? lmr::scale::oobRoundCost(n, report_bytes, per_host)
                           : lmr::scale::oobRoundCostFullMesh(n, report_bytes, per_host);
    state.counters[std::string("store_requests") + suffix] = cost.store_requests;
    state.counters[std::string("store_bytes") + suffix] = cost.store_bytes;
    state.counters[std::string("sockets_per_leader") + suffix] = cost.sockets_per_leader;
  }
}

BENCHMARK(BM_ScaleExact)->Apply(worldSizes);
BENCHMARK(BM_ScaleTiming)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleCheck, ddp, Mesh::kDdp)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleCheck, hsdp, Mesh::kHsdp)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleCheck, tp_pp_dp, Mesh::kTpPpDp)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleCheck, ep_dp, Mesh::kEpDp)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, ddp, Mesh::kDdp, lmr::scale::RecordForm::kSized)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, hsdp, Mesh::kHsdp, lmr::scale::RecordForm::kSized)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, tp_pp_dp, Mesh::kTpPpDp, lmr::scale::RecordForm::kSized)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, ep_dp, Mesh::kEpDp, lmr::scale::RecordForm::kSized)->Apply(worldSizes);

// Before: keyed records and the group table, all-gathered.
BENCHMARK_CAPTURE(BM_ScaleComm, ddp_table, Mesh::kDdp, lmr::scale::RecordForm::kTable)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, hsdp_table, Mesh::kHsdp, lmr::scale::RecordForm::kTable)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, tp_pp_dp_table, Mesh::kTpPpDp, lmr::scale::RecordForm::kTable)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, ep_dp_table, Mesh::kEpDp, lmr::scale::RecordForm::kTable)->Apply(worldSizes);

// Before the group table: every record with its members.
BENCHMARK_CAPTURE(BM_ScaleComm, ddp_inline, Mesh::kDdp, lmr::scale::RecordForm::kInline)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, hsdp_inline, Mesh::kHsdp, lmr::scale::RecordForm::kInline)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, tp_pp_dp_inline, Mesh::kTpPpDp, lmr::scale::RecordForm::kInline)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleComm, ep_dp_inline, Mesh::kEpDp, lmr::scale::RecordForm::kInline)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleDiagnose, process_stall, lmr::scale::Stall::kProcess)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleDiagnose, desync, lmr::scale::Stall::kDesync)->Apply(worldSizes);
BENCHMARK_CAPTURE(BM_ScaleDiagnose, dataloader_stall, lmr::scale::Stall::kDataloader)->Apply(worldSizes);
BENCHMARK(BM_ScaleRouting)->Arg(8)->Arg(64)->Arg(256)->Arg(1024)->Complexity()->Unit(benchmark::kMicrosecond);

}  // namespace
