#include "lmr/oob/diagnose.h"

#include <algorithm>
#include <map>
#include <string>

#include "lmr/consensus/consensus.h"

namespace lmr::oob {
namespace {

std::string key(const Snapshot& s) {
  // Where a rank is: its step and the collective it waits in.
  const CollectiveFingerprint& c = s.collective;
  return std::to_string(s.step) + "|" + std::to_string(c.op) + "|" + std::to_string(c.reduce_or_root) + "|" +
         std::to_string(c.group) + "|" + std::to_string(c.meta) + "|" + std::to_string(c.sequence);
}

FaultReport attributed(const std::string& kind, const std::vector<const RankView*>& present,
                       const std::vector<bool>& bad) {
  FaultReport r;
  r.kind = kind;
  r.scope = kScopeRank;
  for (std::size_t i = 0; i < present.size(); ++i) {
    if (!bad[i]) continue;
    r.ranks.push_back(present[i]->rank);
    r.hosts.push_back(present[i]->host);
  }
  return r;
}

bool strictMinority(const std::vector<bool>& bad) {
  const auto n = std::count(bad.begin(), bad.end(), true);
  return n > 0 && 2 * static_cast<std::size_t>(n) < bad.size();
}

// A rank's typical duration of one kind of I/O call: the one in flight, else the last one.
std::int64_t typical(const RankView& v, bool dataloader) {
  const std::int64_t in_flight = dataloader ? v.dataloader_ns : v.checkpoint_ns;
  if (in_flight > 0) return in_flight;
  return dataloader ? v.snapshot.dataloader_last_ns : v.snapshot.checkpoint_last_ns;
}

// I/O stalls: in flight past the absolute, relative (peers' median) and persistence thresholds.
// The peers' median for each rank comes from one sorted copy of everyone's typical duration
// (the median of all but rank i is the sorted list's element at (n-1)/2, one further along
// when i sits at or before it), and only for ranks past the absolute and persistence
// thresholds: linear after the sort, where a median per rank over the others was quadratic.
std::optional<FaultReport> ioStall(const std::vector<const RankView*>& p, const DiagnosisOptions& o, bool dataloader) {
  std::vector<std::int64_t> sorted;
  sorted.reserve(p.size());
  for (const RankView* v : p) sorted.push_back(typical(*v, dataloader));
  std::sort(sorted.begin(), sorted.end());
  std::vector<bool> bad(p.size(), false);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const std::int64_t mine = dataloader ? p[i]->dataloader_ns : p[i]->checkpoint_ns;
    const std::int64_t watched = dataloader ? p[i]->dataloader_observed_ns : p[i]->checkpoint_observed_ns;
    if (mine <= o.io_absolute_ns || watched < o.io_persistence_ns || p.size() < 2) continue;
    const auto at = static_cast<std::size_t>(
        std::lower_bound(sorted.begin(), sorted.end(), typical(*p[i], dataloader)) - sorted.begin());
    const std::size_t m = (p.size() - 1) / 2;
    const std::int64_t others_median = m < at ? sorted[m] : sorted[m + 1];
    const double reference = static_cast<double>(std::max<std::int64_t>(others_median, 1));
    bad[i] = static_cast<double>(mine) > o.io_relative * reference;
  }
  if (!strictMinority(bad)) return std::nullopt;
  return attributed(dataloader ? report_kind::kDataloaderStall : report_kind::kCheckpointIoStall, p, bad);
}

}  // namespace

FaultReport diagnose(const std::vector<RankView>& views, const DiagnosisOptions& options) {
  std::vector<const RankView*> present;
  std::vector<std::int64_t> missing;
  for (const RankView& v : views) {
    if (v.present) present.push_back(&v);
    else missing.push_back(v.rank);
  }
  nlohmann::json evidence = nlohmann::json::array();
  for (const RankView* v : present) {
    evidence.push_back({{"rank", v->rank},
                        {"host", v->host},
                        {"step", v->snapshot.step},
                        {"layer", v->snapshot.layer},
                        {"in_collective", v->snapshot.in_collective},
                        {"collective_sequence", v->snapshot.collective.sequence},
                        {"collective_op", v->snapshot.collective.op},
                        {"stalled_s", static_cast<double>(v->stalled_ns) / 1e9},
                        {"dataloader_s", static_cast<double>(v->dataloader_ns) / 1e9},
                        {"dataloader_last_s", static_cast<double>(v->snapshot.dataloader_last_ns) / 1e9},
                        {"checkpoint_s", static_cast<double>(v->checkpoint_ns) / 1e9},
                        {"checkpoint_last_s", static_cast<double>(v->snapshot.checkpoint_last_ns) / 1e9}});
  }
  auto finish = [&](FaultReport r) {
    r.missing_ranks = missing;
    r.evidence = evidence;
    return r;
  };
  // Attribution needs a strict majority of the whole group to have answered.
  if (2 * present.size() <= views.size())
    return finish(FaultReport{report_kind::kInconclusiveStall, kScopePeerGroup, {}, {}, {}, {}});

  if (auto r = ioStall(present, options, true)) return finish(*r);
  if (auto r = ioStall(present, options, false)) return finish(*r);

  std::vector<bool> outside(present.size());
  for (std::size_t i = 0; i < present.size(); ++i) outside[i] = !present[i]->snapshot.in_collective;
  if (strictMinority(outside)) return finish(attributed(report_kind::kProcessStall, present, outside));

  if (std::none_of(outside.begin(), outside.end(), [](bool b) { return b; })) {
    std::vector<std::string> positions;
    for (const RankView* v : present) positions.push_back(key(v->snapshot));
    const auto c3 = consensus::exact(positions);
    if (c3.status == consensus::Status::kAttributed)
      return finish(attributed(report_kind::kCollectiveDesync, present, c3.bitmap));
    if (c3.status == consensus::Status::kAgree && !missing.empty()) {
      // Everyone who answered waits at the same place: the ranks whose daemons did not
      // answer are the ones holding the group.
      FaultReport r{report_kind::kUnresponsiveRank, kScopeRank, missing, {}, {}, {}};
      for (const RankView& v : views)
        if (!v.present) r.hosts.push_back(v.host);
      return finish(r);
    }
    if (c3.status == consensus::Status::kAgree)
      return finish(FaultReport{report_kind::kGroupStall, kScopePeerGroup, {}, {}, {}, {}});
  }
  return finish(FaultReport{report_kind::kInconclusiveStall, kScopePeerGroup, {}, {}, {}, {}});
}

nlohmann::json toJson(const FaultReport& r) {
  return nlohmann::json{{"kind", r.kind},
                        {"scope", r.scope},
                        {"ranks", r.ranks},
                        {"hosts", r.hosts},
                        {"missing_ranks", r.missing_ranks},
                        {"evidence", r.evidence}};
}

}  // namespace lmr::oob
