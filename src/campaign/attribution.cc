#include "lmr/campaign/attribution.h"

#include <algorithm>
#include <map>

#include "lmr/common/error.h"

namespace lmr::campaign {

std::string_view name(Explanation e) noexcept {
  switch (e) {
    case Explanation::kOccurrence: return "occurrence";
    case Explanation::kResidual: return "residual";
    case Explanation::kUnexplained: return "unexplained";
  }
  return "unexplained";
}

namespace {

const Fault* findFault(const Incident& incident, const std::string& fault_id) {
  for (const Fault& f : incident.faults)
    if (f.fault_id == fault_id) return &f;
  return nullptr;
}

bool contains(const std::vector<std::int64_t>& v, std::int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool active(const OccurrenceWindow& w, std::int64_t step) { return w.first <= step && (!w.last || step <= *w.last); }

// A recovery at iteration r restores state before iteration r runs.
bool recoveredBetween(const std::vector<std::int64_t>& recoveries, std::int64_t after, std::int64_t upto) {
  return std::any_of(recoveries.begin(), recoveries.end(), [&](std::int64_t r) { return after < r && r <= upto; });
}

}  // namespace

std::vector<OccurrenceWindow> occurrenceWindows(const Campaign& campaign, const std::vector<InjectionRecord>& records,
                                                const std::vector<std::int64_t>& recoveries) {
  std::map<std::string, OccurrenceWindow> by_id;
  std::map<std::string, const Incident*> incident_of;
  for (const InjectionRecord& r : records) {
    if (r.status == RecordStatus::kSkippedProbability || !r.actual_iteration) continue;
    const Incident* incident = campaign.findIncident(r.incident_id);
    if (incident == nullptr) throw InvalidArgument("record " + r.injection_id + " names no incident of the manifest");
    incident_of[r.occurrence_id] = incident;
    auto [it, fresh] = by_id.try_emplace(r.occurrence_id);
    OccurrenceWindow& w = it->second;
    if (fresh) {
      w.occurrence_id = r.occurrence_id;
      w.first = *r.actual_iteration;
    }
    w.first = std::min(w.first, *r.actual_iteration);
    const Fault* fault = findFault(*incident, r.fault_id);
    const std::int64_t rank = r.expected_rank.value_or(r.execution_rank);
    if (!contains(w.ranks, rank)) w.ranks.push_back(rank);
    if (fault != nullptr && isStateSurface(fault->target.surface) && !contains(w.state_ranks, rank))
      w.state_ranks.push_back(rank);
  }
  std::vector<OccurrenceWindow> out;
  for (auto& [id, w] : by_id) {
    const Lifetime& life = incident_of.at(id)->lifetime;
    w.last = life.lastActiveIteration(w.first);
    if (!w.last && life.kind == LifetimeKind::kUntil && life.until == Until::kRecovery) {
      for (std::int64_t r : recoveries)
        if (r > w.first && (!w.last || r - 1 < *w.last)) w.last = r - 1;
    }
    std::sort(w.ranks.begin(), w.ranks.end());
    std::sort(w.state_ranks.begin(), w.state_ranks.end());
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end(), [](const OccurrenceWindow& a, const OccurrenceWindow& b) {
    return a.first != b.first ? a.first < b.first : a.occurrence_id < b.occurrence_id;
  });
  return out;
}

std::vector<Explained> explainAttributions(const Campaign& campaign, const std::vector<InjectionRecord>& records,
                                           const std::vector<Attribution>& attributions,
                                           const std::vector<std::int64_t>& recoveries) {
  const std::vector<OccurrenceWindow> windows = occurrenceWindows(campaign, records, recoveries);
  std::vector<Explained> out;
  out.reserve(attributions.size());
  for (const Attribution& a : attributions) {
    Explained e;
    const OccurrenceWindow* hit = nullptr;
    for (const OccurrenceWindow& w : windows)
      if (active(w, a.step) && contains(w.ranks, a.rank)) {
        hit = &w;
        break;
      }
    if (hit != nullptr) {
      e = {Explanation::kOccurrence, hit->occurrence_id};
    } else {
      const OccurrenceWindow* residual = nullptr;
      if (a.state && a.kind == "sdc")
        for (const OccurrenceWindow& w : windows)
          if (w.last && *w.last < a.step && contains(w.state_ranks, a.rank) &&
              !recoveredBetween(recoveries, *w.last, a.step) && (residual == nullptr || *w.last >= *residual->last))
            residual = &w;
      if (residual != nullptr) {
        e = {Explanation::kResidual, residual->occurrence_id};
      } else {
        for (const OccurrenceWindow& w : windows)
          if (active(w, a.step)) {
            e = {Explanation::kOccurrence, w.occurrence_id};
            break;
          }
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace lmr::campaign
