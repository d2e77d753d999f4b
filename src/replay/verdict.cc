#include "lmr/replay/verdict.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "lmr/common/error.h"
#include "lmr/moe/alltoall.h"

namespace lmr::replay {

namespace {

using consensus::Status;

// Each compute peer's position by rank: built once per decision, so that placing the ranks of
// every group is linear in the world (a search per rank made a check O(N^2) at scale,
// docs/scale.md).
using PositionIndex = std::unordered_map<std::int64_t, std::size_t>;

std::size_t positionOf(const PositionIndex& index, std::int64_t rank) {
  const auto it = index.find(rank);
  if (it == index.end()) throw InvalidArgument("rank " + std::to_string(rank) + " is not a compute peer");
  return it->second;
}

// The layout checked (validate()'s contract) and its position index.
PositionIndex validated(const PeerLayout& layout) {
  if (layout.ranks.empty()) throw InvalidArgument("a peer layout needs at least one compute peer");
  PositionIndex index;
  index.reserve(layout.ranks.size());
  for (std::size_t i = 0; i < layout.ranks.size(); ++i)
    if (!index.emplace(layout.ranks[i], i).second) throw InvalidArgument("compute peers repeat a rank");
  const auto partition = [&](const std::vector<std::vector<std::int64_t>>& groups, const std::string& kind) {
    std::vector<bool> grouped(layout.ranks.size(), false);
    for (const auto& group : groups) {
      if (group.empty()) throw InvalidArgument("a " + kind + " is empty");
      for (std::int64_t r : group) {
        const std::size_t i = positionOf(index, r);
        if (grouped[i]) throw InvalidArgument("rank " + std::to_string(r) + " is in two " + kind + "s");
        grouped[i] = true;
      }
    }
  };
  partition(layout.state_groups, "state group");
  partition(layout.expert_groups, "expert group");
  partition(layout.ep_groups, "expert-parallel group");
  return index;
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

void validate(const PeerLayout& layout) { validated(layout); }

std::int64_t sourceRank(const PeerLayout& layout, std::int64_t step) {
  validate(layout);
  const auto n = static_cast<std::int64_t>(layout.ranks.size());
  return layout.ranks[static_cast<std::size_t>(((step % n) + n) % n)];
}

SurfaceName parseSurface(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == name.size())
    throw InvalidArgument("surface name \"" + std::string(name) + "\" is not <recipe>.<evidence>");
  SurfaceName s{std::string(name.substr(0, dot)), std::string(name.substr(dot + 1))};
  s.state = isStateSource(name);
  s.routing = s.evidence == "routing";
  s.expert = s.recipe.find(".expert.") != std::string::npos;
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
  const PositionIndex index = validated(layout);
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

  const auto positions = [&](const std::vector<std::vector<std::int64_t>>& groups) {
    std::vector<std::vector<std::size_t>> out;
    for (const auto& group : groups) {
      out.emplace_back();
      for (std::int64_t r : group) out.back().push_back(positionOf(index, r));
    }
    return out;
  };
  std::vector<std::size_t> everyone(n);
  for (std::size_t i = 0; i < n; ++i) everyone[i] = i;
  const std::vector<std::vector<std::size_t>> state_groups = positions(layout.state_groups);
  const std::vector<std::vector<std::size_t>> expert_groups =
      layout.expert_groups.empty() ? std::vector<std::vector<std::size_t>>{everyone} : positions(layout.expert_groups);
  const std::vector<std::vector<std::size_t>> ep_groups = positions(layout.ep_groups);
  // The state groups inside each expert group (an expert's held state), in (expert group,
  // state group) order, each in its state group's order: by membership, linear in the world.
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> expert_of(n, kNone);
  for (std::size_t e = 0; e < expert_groups.size(); ++e)
    for (std::size_t i : expert_groups[e]) expert_of[i] = e;
  std::map<std::pair<std::size_t, std::size_t>, std::vector<std::size_t>> intersections;
  for (std::size_t g = 0; g < state_groups.size(); ++g)
    for (std::size_t i : state_groups[g])
      if (expert_of[i] != kNone) intersections[{expert_of[i], g}].push_back(i);
  std::vector<std::vector<std::size_t>> expert_state_groups;
  expert_state_groups.reserve(intersections.size());
  for (auto& [_, both] : intersections) expert_state_groups.push_back(std::move(both));
  const auto failedRecipe = [&failed](const std::string& surface) {
    for (const std::string& recipe : failed)
      if (surface.size() > recipe.size() && surface.compare(0, recipe.size(), recipe) == 0 &&
          surface[recipe.size()] == '.')
        return true;
    return false;
  };

  std::set<std::string> names;
  for (const CheckVote& vote : votes)
    for (const auto& [name, _] : vote.surfaces)
      if (!failedRecipe(name)) names.insert(name);
  // The names are visited in order, and every vote's surfaces are a map in the same order: one
  // cursor per vote walks it alongside, so a peer's entry for the current name is found by
  // stepping past the names before it (each entry passed once per check) instead of a search
  // per (name, peer).
  using Entry = std::map<std::string, std::string>::const_iterator;
  std::vector<Entry> cursor(n);
  for (std::size_t i = 0; i < n; ++i) cursor[i] = votes[i].surfaces.begin();
  for (const std::string& name : names) {
    const SurfaceName surface = parseSurface(name);
    const auto entryOf = [&](std::size_t i) -> const std::string* {
      Entry& it = cursor[i];
      const Entry end = votes[i].surfaces.end();
      while (it != end && it->first < name) ++it;
      return it != end && it->first == name ? &it->second : nullptr;
    };
    const auto evidenceOf = [&](std::size_t i) {
      const std::string* e = entryOf(i);
      return e == nullptr ? std::string() : *e;
    };
    const auto voted = [&](const std::vector<std::size_t>& group) {
      return std::any_of(group.begin(), group.end(), [&](std::size_t i) { return entryOf(i) != nullptr; });
    };
    SurfaceVerdict s;
    s.bitmap.assign(n, false);
    s.evidence.assign(n, std::string());
    std::string why;
    if (surface.routing) {
      for (const auto& group : ep_groups) {
        if (!voted(group)) continue;
        std::vector<std::string> group_votes;
        for (std::size_t i : group) group_votes.push_back(evidenceOf(i));
        const moe::RoutingVerdict r = moe::decideRouting(group_votes);
        for (std::size_t k = 0; k < group.size(); ++k) {
          s.bitmap[group[k]] = r.bitmap[k];
          s.evidence[group[k]] = group_votes[k];
        }
        if (!r.reason.empty() && why.empty()) why = r.reason;
        s.status = consensus::worse(s.status, r.status);
      }
      if (ep_groups.empty()) why = "alltoall_unverified: the peer layout has no expert-parallel groups";
      s.split = !why.empty();
    } else {
      const std::vector<std::vector<std::size_t>>& groups =
          surface.expert ? (surface.state ? expert_state_groups : expert_groups)
                         : (surface.state ? state_groups : std::vector<std::vector<std::size_t>>{everyone});
      for (const auto& group : groups) {
        if (surface.expert && !voted(group)) continue;  // another expert group's expert
        std::vector<std::string> evidence;
        std::vector<std::int64_t> ranks;
        for (std::size_t i : group) {
          evidence.push_back(evidenceOf(i));
          ranks.push_back(layout.ranks[i]);
        }
        const consensus::ExactResult r = consensus::exact(evidence, ranks);
        for (std::size_t k = 0; k < group.size(); ++k) {
          s.bitmap[group[k]] = r.bitmap[k];
          s.evidence[group[k]] = evidence[k];
        }
        s.split = s.split || r.status == Status::kInconclusive;
        s.status = consensus::worse(s.status, r.status);
      }
      if (s.split) why = "no_majority: the peers disagree and no strict majority agrees";
    }
    if (std::any_of(s.bitmap.begin(), s.bitmap.end(), [](bool b) { return b; })) {
      for (std::size_t i = 0; i < n; ++i) v.sdc_bitmap[i] = v.sdc_bitmap[i] || s.bitmap[i];
      v.sdc_sources.push_back(name);
    }
    if (s.split) inconclusive(name, why);
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
