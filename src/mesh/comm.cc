#include "lmr/mesh/comm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <set>

#include "lmr/common/error.h"
#include "lmr/common/json.h"

namespace lmr::mesh {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void checkTimings(const std::vector<double>& v, const CollectiveObservation& o, const char* what) {
  if (v.size() != o.members.size())
    throw InvalidArgument("collective observation of group " + o.group + ": " + std::to_string(v.size()) + " " + what +
                          " timings for " + std::to_string(o.members.size()) + " members");
  for (double t : v)
    if (!std::isfinite(t) || t < 0)
      throw InvalidArgument("collective observation of group " + o.group + ": a " + what +
                            " timing is negative or not finite");
}

replay::StragglerOptions trackerOptions(const CommOptions& o) {
  replay::StragglerOptions s;
  s.timing = o.timing;
  s.confirmation_rounds = o.confirmation_rounds;
  s.confirmation_checks = o.confirmation_checks;
  s.temporal_window = o.temporal_window;
  return s;
}

std::string describeRanks(const std::set<std::int64_t>& ranks) {
  std::string out;
  for (std::int64_t r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return "{" + out + "}";
}

// Two groups of one class: the slower is an outlier when it exceeds the faster by the
// absolute threshold and by pair_relative_threshold of the faster.
consensus::TimingResult comparePair(double a, double b, const std::vector<std::int64_t>& ids, const CommOptions& o) {
  consensus::TimingResult t;
  t.evidence = {a, b};
  t.peer_ranks = ids;
  t.median = std::min(a, b);  // the reference: the faster group
  const double excess = std::max(a, b) - t.median;
  const bool outlier = excess > o.timing.absolute_threshold && excess > o.pair_relative_threshold * t.median;
  t.status = outlier ? consensus::Status::kAttributed : consensus::Status::kAgree;
  t.bitmap = {outlier && a > b, outlier && b > a};
  return t;
}

// The members of one collective that arrived late: `lateness` is each member's arrival after
// the earliest (the longest wait less its own). The reference is the strict majority that
// arrived closest together (the shortest span of n/2 + 1 sorted arrivals): its median arrival
// and its spread (1.4826 x MAD, at least the floor). A member is late when it arrived after
// that median by more than kappa times the spread and by more than the absolute threshold.
// Early arrivals make nobody wait, and lie outside the majority: they cannot widen the spread
// a late member is measured against (with the median and MAD of all members, one early rank
// beside one late rank in a group of 4 hid an 80 ms lateness). As with timing consensus,
// the late members must be a strict minority, else nobody is named.
std::vector<std::size_t> lateArrivals(const std::vector<double>& lateness, const consensus::TimingOptions& o) {
  std::vector<double> sorted = lateness;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size(), h = n / 2 + 1;
  std::size_t first = 0;
  for (std::size_t k = 1; k + h <= n; ++k)
    if (sorted[k + h - 1] - sorted[k] < sorted[first + h - 1] - sorted[first]) first = k;
  const std::vector<double> majority(sorted.begin() + static_cast<std::ptrdiff_t>(first),
                                     sorted.begin() + static_cast<std::ptrdiff_t>(first + h));
  const double reference = median(majority);
  std::vector<double> deviations;
  for (double v : majority) deviations.push_back(std::fabs(v - reference));
  const double scale = std::max(1.4826 * median(deviations), o.scale_floor);
  std::vector<std::size_t> late;
  for (std::size_t i = 0; i < n; ++i) {
    const double excess = lateness[i] - reference;
    if (excess > o.kappa * scale && excess > o.absolute_threshold) late.push_back(i);
  }
  if (2 * late.size() >= n) late.clear();
  return late;
}

}  // namespace

ResourceMap ResourceMap::fromJson(std::string_view text, std::int64_t world_size) {
  if (world_size < 1) throw InvalidArgument("a resource map needs a world of at least one rank");
  const json::Document doc = json::parse(text, "resource map");
  const json::Json& root = doc.value;
  json::requireObject(root, "");
  json::requireKnownKeys(root, "", {"version", "ranks"});
  if (json::asInteger(json::requireMember(root, "", "version"), "version") != 1)
    json::fail("version", "unsupported version (this release reads version 1)");
  const json::Json& ranks = json::requireMember(root, "", "ranks");
  json::requireObject(ranks, "ranks");
  ResourceMap out;
  out.ranks_.resize(static_cast<std::size_t>(world_size));
  std::vector<bool> seen(static_cast<std::size_t>(world_size), false);
  for (const auto& [key, value] : ranks.items()) {
    const std::string path = json::child("ranks", key);
    std::int64_t rank = -1;
    if (key.empty() || key.size() > 18 ||
        !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
      json::fail(path, "a rank key is a decimal rank number");
    rank = std::stoll(key);
    if (rank >= world_size) json::fail(path, "rank " + key + " is outside the world of " + std::to_string(world_size));
    if (std::to_string(rank) != key) json::fail(path, "a rank key has no leading zeros");
    json::requireObject(value, path);
    json::requireKnownKeys(value, path, {"host", "nic", "switch"});
    Resources& r = out.ranks_[static_cast<std::size_t>(rank)];
    r.host = json::asIdentifier(json::requireMember(value, path, "host"), json::child(path, "host"));
    if (const json::Json* nic = json::findMember(value, "nic"))
      r.nic = json::asIdentifier(*nic, json::child(path, "nic"));
    if (const json::Json* sw = json::findMember(value, "switch"))
      r.switch_name = json::asIdentifier(*sw, json::child(path, "switch"));
    seen[static_cast<std::size_t>(rank)] = true;
  }
  for (std::size_t r = 0; r < seen.size(); ++r)
    if (!seen[r]) json::fail("ranks", "rank " + std::to_string(r) + " is missing");
  return out;
}

ResourceMap ResourceMap::fromHosts(const std::vector<std::string>& hosts) {
  if (hosts.empty()) throw InvalidArgument("a resource map needs the host of at least one rank");
  ResourceMap out;
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    if (hosts[r].empty()) throw InvalidArgument("rank " + std::to_string(r) + " has an empty host name");
    out.ranks_.push_back(Resources{hosts[r], "", ""});
  }
  return out;
}

const Resources& ResourceMap::of(std::int64_t rank) const {
  if (rank < 0 || rank >= worldSize())
    throw InvalidArgument("rank " + std::to_string(rank) + " is not in the resource map of " +
                          std::to_string(worldSize()) + " ranks");
  return ranks_[static_cast<std::size_t>(rank)];
}

std::vector<CollectiveObservation> completeObservations(const std::vector<std::vector<CollectiveRecord>>& by_rank,
                                                        const GroupTable& groups) {
  struct Call {
    const std::string* name = nullptr;  // the group's id (the record's own, or its table entry's)
    const std::vector<std::int64_t>* members = nullptr;  // null: the reporters, `size` of them
    std::int64_t size = 0;
    const std::string* collective = nullptr;
    std::map<std::int64_t, const CollectiveRecord*> by_member;
    std::uint64_t bytes = 0;
    bool consistent = true;
  };
  // Calls are told apart by the records' own group field (a short key when keyed), never by a
  // long name or a member list: each record costs O(log calls), not O(group size).
  std::map<std::pair<std::string_view, std::int64_t>, Call> calls;
  for (std::size_t rank = 0; rank < by_rank.size(); ++rank) {
    for (const CollectiveRecord& r : by_rank[rank]) {
      const std::string* name = &r.group;
      const std::vector<std::int64_t>* members = &r.members;
      if (r.members.empty()) {
        const auto entry = groups.find(r.group);
        if (entry != groups.end()) {
          name = &entry->second.name;
          members = &entry->second.members;
        } else if (r.group_size > 0) {
          name = nullptr;
          members = nullptr;
        } else {
          continue;  // its group's entry was not gathered: left out
        }
      }
      const auto [at, first] = calls.try_emplace({r.group, r.call});
      Call& c = at->second;
      if (first) {
        c.name = name;
        c.members = members;
        c.size = members == nullptr ? r.group_size : 0;
        c.collective = &r.collective;
      }
      const bool same_group = members == nullptr
                                  ? c.members == nullptr && r.group_size == c.size
                                  : c.members != nullptr && (members == c.members || *members == *c.members);
      c.consistent = c.consistent && same_group && r.collective == *c.collective;
      c.by_member.emplace(static_cast<std::int64_t>(rank), &r);
      c.bytes = std::max(c.bytes, r.bytes);
    }
  }
  std::vector<CollectiveObservation> out;
  for (const auto& [key, c] : calls) {
    if (!c.consistent) continue;
    CollectiveObservation o{"", {}, *c.collective, c.bytes, {}, {}};
    if (c.members == nullptr) {  // the reporters, when all `size` of them reported
      if (static_cast<std::int64_t>(c.by_member.size()) != c.size) continue;
      o.group = "ranks:";
      for (const auto& [rank, record] : c.by_member) {
        o.group += (o.members.empty() ? "" : ",") + std::to_string(rank);
        o.members.push_back(rank);
      }
    } else {
      if (c.by_member.size() != c.members->size()) continue;
      o.group = *c.name;
      o.members = *c.members;
    }
    for (std::int64_t m : o.members) {
      const auto it = c.by_member.find(m);
      if (it == c.by_member.end()) break;
      o.wait.push_back(it->second->wait);
      o.transfer.push_back(it->second->transfer);
    }
    if (o.wait.size() == o.members.size()) out.push_back(std::move(o));
  }
  return out;
}

std::int64_t sizeClass(std::uint64_t bytes) { return bytes <= 1 ? 0 : std::bit_width(bytes) - 1; }

CommTracker::CommTracker(CommOptions options) : options_(options), tracker_(trackerOptions(options)) {}

CommVerdict CommTracker::observe(std::int64_t step, const std::vector<CollectiveObservation>& round,
                                 const ResourceMap* map, const std::vector<FabricFinding>& fabric) {
  // Validate everything first: a malformed round changes no history.
  for (const FabricFinding& f : fabric) {
    if (f.kind != "nic" && f.kind != "switch")
      throw InvalidArgument("a fabric finding's kind is \"nic\" or \"switch\", got \"" + f.kind + "\"");
    if (f.name.empty()) throw InvalidArgument("a fabric finding has an empty name");
    if (map == nullptr) throw InvalidArgument("fabric findings need a resource map to relate them to ranks");
    map->of(f.reported_by);
  }
  for (const CollectiveObservation& o : round) {
    if (o.group.empty()) throw InvalidArgument("a collective observation has an empty group id");
    if (o.members.empty()) throw InvalidArgument("collective observation of group " + o.group + " has no members");
    if (std::set<std::int64_t>(o.members.begin(), o.members.end()).size() != o.members.size())
      throw InvalidArgument("collective observation of group " + o.group + " repeats a member");
    checkTimings(o.wait, o, "wait");
    checkTimings(o.transfer, o, "transfer");
    std::vector<std::int64_t> sorted = o.members;
    std::sort(sorted.begin(), sorted.end());
    const auto known = members_.find(o.group);
    if (known != members_.end() && known->second != sorted)
      throw InvalidArgument("group " + o.group + " was observed before with other members");
    if (map != nullptr)
      for (std::int64_t r : o.members) map->of(r);
  }
  CommVerdict v;
  v.observations = round.size();
  std::set<std::int64_t> late;
  // Comparable groups: same collective, same size class; each group's evidence is the
  // median transfer of its members, one value per group per round.
  std::map<std::string, std::vector<const CollectiveObservation*>> classes;
  for (const CollectiveObservation& o : round) {
    std::vector<std::int64_t> sorted = o.members;
    std::sort(sorted.begin(), sorted.end());
    members_[o.group] = sorted;
    group_ids_.emplace(o.group, static_cast<std::int64_t>(group_ids_.size()));
    classes[o.collective + "#" + std::to_string(sizeClass(o.bytes))].push_back(&o);
    // Late arrivers: the members whose peers waited for them.
    if (o.members.size() >= 3) {
      const double most = *std::max_element(o.wait.begin(), o.wait.end());
      std::vector<double> lateness;
      for (double w : o.wait) lateness.push_back(most - w);
      for (std::size_t i : lateArrivals(lateness, options_.timing)) late.insert(o.members[i]);
    }
  }
  std::set<std::string> slow, candidates, healthy;
  for (auto& [name, groups] : classes) {
    // One value per group per class and round: the median of its observations' transfers.
    std::map<std::string, std::vector<double>> transfers;
    for (const CollectiveObservation* o : groups) transfers[o->group].push_back(median(o->transfer));
    std::vector<std::vector<double>> evidence;
    std::vector<std::int64_t> ids;
    std::vector<std::string> names;
    for (const auto& [group, times] : transfers) {
      evidence.push_back({median(times)});
      ids.push_back(group_ids_.at(group));
      names.push_back(group);
    }
    replay::StragglerTracker::Verdict t;
    if (evidence.size() >= 3) {
      t = tracker_.observe(name, step, evidence, ids);
    } else if (evidence.size() == 2 && options_.pair_relative_threshold > 0) {
      t = tracker_.confirm(name, step, comparePair(evidence[0][0], evidence[1][0], ids, options_));
    } else {
      continue;  // nothing to compare with: no evidence either way
    }
    const bool conclusive = t.check.status != consensus::Status::kInconclusive;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (t.confirmed[i]) slow.insert(names[i]);
      if (t.check.status == consensus::Status::kAttributed && t.check.bitmap[i]) {
        candidates.insert(names[i]);
      } else if (conclusive) {
        healthy.insert(names[i]);
      }
    }
  }
  v.slow_groups.assign(slow.begin(), slow.end());
  v.candidate_groups.assign(candidates.begin(), candidates.end());
  v.late_ranks.assign(late.begin(), late.end());
  if (slow.empty()) return v;
  // No single rank: a switch that a fabric source reports degraded, and that every slow
  // group reaches through one of its members, is what they have in common.
  const auto noCulprit = [&](std::string reason) {
    v.reason = std::move(reason);
    if (map == nullptr) return v;
    std::vector<const FabricFinding*> common;
    for (const FabricFinding& f : fabric) {
      if (f.kind != "switch") continue;
      bool every = true;
      for (const std::string& g : slow) {
        const auto& m = members_.at(g);
        every =
            every && std::any_of(m.begin(), m.end(), [&](std::int64_t r) { return map->of(r).switch_name == f.name; });
      }
      const bool seen =
          std::any_of(common.begin(), common.end(), [&](const FabricFinding* c) { return c->name == f.name; });
      if (every && !seen) common.push_back(&f);
    }
    if (common.size() == 1) {
      v.fabric = *common.front();
      v.reason += "; every slow group reaches switch " + common.front()->name + ", reported degraded";
    }
    return v;
  };
  if (slow.size() == 1)
    return noCulprit("one slow group (" + *slow.begin() + "): no other slow group narrows it to one rank");
  std::set<std::int64_t> shared(members_.at(*slow.begin()).begin(), members_.at(*slow.begin()).end());
  for (const std::string& g : slow) {
    std::set<std::int64_t> both;
    for (std::int64_t r : members_.at(g))
      if (shared.count(r)) both.insert(r);
    shared = std::move(both);
  }
  if (shared.size() != 1)
    return noCulprit(shared.empty() ? "the slow groups share no rank"
                                    : "the slow groups share more than one rank " + describeRanks(shared));
  const std::int64_t rank = *shared.begin();
  for (const std::string& g : healthy) {
    // A group slow in one class and not in another (a slow link barely slows messages
    // small enough to fit its burst) is slow: it does not contradict.
    if (slow.count(g)) continue;
    const auto& m = members_.at(g);
    if (std::find(m.begin(), m.end(), rank) != m.end())
      return noCulprit("the slow groups share rank " + std::to_string(rank) + ", but group " + g +
                       " holding it is not slow");
  }
  v.rank = rank;
  if (map == nullptr) return v;
  const Resources& where = map->of(rank);
  v.resources = where;
  for (const FabricFinding& f : fabric)
    if (f.kind == "nic" && !where.nic.empty() && f.name == where.nic && map->of(f.reported_by).host == where.host) {
      v.fabric = f;
      return v;
    }
  for (const FabricFinding& f : fabric)
    if (f.kind == "switch" && !where.switch_name.empty() && f.name == where.switch_name) {
      v.fabric = f;
      return v;
    }
  return v;
}

}  // namespace lmr::mesh
