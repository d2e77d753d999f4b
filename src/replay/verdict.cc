#include "lmr/replay/verdict.h"

#include <algorithm>
#include <set>

#include "lmr/common/error.h"

namespace lmr::replay {

namespace {

using consensus::Status;

std::size_t positionOf(const PeerLayout& layout, std::int64_t rank) {
  const auto it = std::find(layout.ranks.begin(), layout.ranks.end(), rank);
  if (it == layout.ranks.end()) throw InvalidArgument("rank " + std::to_string(rank) + " is not a compute peer");
  return static_cast<std::size_t>(it - layout.ranks.begin());
}

void checkVotes(const PeerLayout& layout, std::size_t votes) {
  if (votes != layout.ranks.size())
    throw InvalidArgument("a check needs one vote per compute peer: " + std::to_string(votes) + " votes for " +
                          std::to_string(layout.ranks.size()) + " peers");
}

}  // namespace

CheckVerdict CheckVerdict::forPeers(std::size_t peers) {
  CheckVerdict v;
  v.sdc_bitmap.assign(peers, false);
  v.straggler_bitmap.assign(peers, false);
  v.straggler_candidates.assign(peers, false);
  return v;
}

void CheckVerdict::addInconclusive(const std::string& what, const std::string& why) {
  if (!reasons.count(what)) inconclusive.push_back(what);
  reasons[what] = why;
}

void validate(const PeerLayout& layout) {
  if (layout.ranks.empty()) throw InvalidArgument("a peer layout needs at least one compute peer");
  std::set<std::int64_t> seen(layout.ranks.begin(), layout.ranks.end());
  if (seen.size() != layout.ranks.size()) throw InvalidArgument("compute peers repeat a rank");
  std::set<std::int64_t> grouped;
  for (const auto& group : layout.state_groups) {
    if (group.empty()) throw InvalidArgument("a state group is empty");
    for (std::int64_t r : group) {
      positionOf(layout, r);
      if (!grouped.insert(r).second) throw InvalidArgument("rank " + std::to_string(r) + " is in two state groups");
    }
  }
}

std::int64_t sourceRank(const PeerLayout& layout, std::int64_t step) {
  validate(layout);
  const auto n = static_cast<std::int64_t>(layout.ranks.size());
  return layout.ranks[static_cast<std::size_t>(((step % n) + n) % n)];
}

SurfaceName parseSurface(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == name.size())
    throw InvalidArgument("surface name \"" + std::string(name) + "\" is not <recipe>.<evidence>");
  SurfaceName s{std::string(name.substr(0, dot)), std::string(name.substr(dot + 1)), false};
  s.state = isStateSource(name);
  return s;
}

Readiness decideReadiness(const PeerLayout& layout, const std::vector<std::string>& recipes,
                          const std::vector<ReadinessVote>& votes) {
  validate(layout);
  checkVotes(layout, votes.size());
  Readiness out;
  for (const std::string& recipe : recipes) {
    std::string why;
    for (std::size_t i = 0; i < votes.size() && why.empty(); ++i) {
      auto it = votes[i].reasons.find(recipe);
      if (it != votes[i].reasons.end()) why = it->second + " (rank " + std::to_string(layout.ranks[i]) + ")";
    }
    if (why.empty()) {
      std::vector<std::string> contracts;
      for (const ReadinessVote& v : votes) {
        auto it = v.contracts.find(recipe);
        contracts.push_back(it == v.contracts.end() ? std::string() : it->second);
      }
      if (consensus::exact(contracts, layout.ranks).status != Status::kAgree || contracts.front().empty())
        why = "contract_mismatch: peers captured different calls (step, module or tensor shapes)";
    }
    out.ready.push_back(why.empty());
    if (!why.empty()) out.reasons[recipe] = why;
  }
  return out;
}

CheckVerdict decideCheck(const PeerLayout& layout, std::int64_t step, const std::vector<std::string>& checked,
                         const std::vector<std::pair<std::string, std::string>>& not_ready,
                         const std::vector<CheckVote>& votes, StragglerTracker& tracker) {
  validate(layout);
  checkVotes(layout, votes.size());
  const std::size_t n = layout.ranks.size();
  CheckVerdict v = CheckVerdict::forPeers(n);
  auto inconclusive = [&v](const std::string& what, const std::string& why) { v.addInconclusive(what, why); };
  for (const auto& [recipe, why] : not_ready) inconclusive(recipe, why);

  // A recipe that failed on any peer is Inconclusive on all of them.
  std::set<std::string> failed;
  for (std::size_t i = 0; i < n; ++i)
    for (const auto& [recipe, text] : votes[i].errors)
      if (failed.insert(recipe).second)
        inconclusive(recipe, "replay_error: " + text + " (rank " + std::to_string(layout.ranks[i]) + ")");

  std::vector<std::vector<std::size_t>> state_groups;
  for (const auto& group : layout.state_groups) {
    state_groups.emplace_back();
    for (std::int64_t r : group) state_groups.back().push_back(positionOf(layout, r));
  }
  std::vector<std::size_t> everyone(n);
  for (std::size_t i = 0; i < n; ++i) everyone[i] = i;

  std::set<std::string> names;
  for (const CheckVote& vote : votes)
    for (const auto& [name, _] : vote.surfaces)
      if (!failed.count(parseSurface(name).recipe)) names.insert(name);
  for (const std::string& name : names) {
    const SurfaceName surface = parseSurface(name);
    const std::vector<std::vector<std::size_t>> groups =
        surface.state ? state_groups : std::vector<std::vector<std::size_t>>{everyone};
    SurfaceVerdict s;
    s.bitmap.assign(n, false);
    s.evidence.assign(n, std::string());
    for (const auto& positions : groups) {
      std::vector<std::string> evidence;
      std::vector<std::int64_t> ranks;
      for (std::size_t i : positions) {
        auto it = votes[i].surfaces.find(name);
        evidence.push_back(it == votes[i].surfaces.end() ? std::string() : it->second);
        ranks.push_back(layout.ranks[i]);
      }
      const consensus::ExactResult r = consensus::exact(evidence, ranks);
      for (std::size_t k = 0; k < positions.size(); ++k) {
        s.bitmap[positions[k]] = r.bitmap[k];
        s.evidence[positions[k]] = evidence[k];
      }
      s.split = s.split || r.status == Status::kInconclusive;
      if (r.status == Status::kAttributed || (r.status == Status::kInconclusive && s.status == Status::kAgree))
        s.status = r.status;
    }
    if (std::any_of(s.bitmap.begin(), s.bitmap.end(), [](bool b) { return b; })) {
      for (std::size_t i = 0; i < n; ++i) v.sdc_bitmap[i] = v.sdc_bitmap[i] || s.bitmap[i];
      v.sdc_sources.push_back(name);
    }
    if (s.split) inconclusive(name, "no_majority: the peers disagree and no strict majority agrees");
    v.surfaces.emplace(name, std::move(s));
  }

  for (const std::string& recipe : checked) {
    if (failed.count(recipe)) continue;
    std::vector<std::vector<double>> repetitions;
    for (const CheckVote& vote : votes) {
      auto it = vote.repetitions.find(recipe);
      if (it == vote.repetitions.end() || it->second.empty()) break;
      repetitions.push_back(it->second);
    }
    if (repetitions.size() != n) continue;  // no timing from some peer: a recipe with nothing to replay
    const StragglerTracker::Verdict t = tracker.observe(recipe, step, repetitions, layout.ranks);
    for (std::size_t i = 0; i < n; ++i) {
      v.straggler_bitmap[i] = v.straggler_bitmap[i] || t.confirmed[i];
      v.straggler_candidates[i] = v.straggler_candidates[i] || t.check.bitmap[i];
    }
  }
  const auto any = [](const std::vector<bool>& b) { return std::any_of(b.begin(), b.end(), [](bool x) { return x; }); };
  if (any(v.sdc_bitmap) || any(v.straggler_bitmap)) {
    v.status = Status::kAttributed;
  } else if (!v.inconclusive.empty()) {
    v.status = Status::kInconclusive;
  }
  return v;
}

}  // namespace lmr::replay
