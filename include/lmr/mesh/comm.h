// Communication stragglers: which process groups are slow at their collectives, and the one
// rank (and its host) that every slow group shares. Decisions over complete observations
// that every rank holds (gathered before the call), so every rank reaches the same verdict.
//
// A collective's time on a member splits into the wait for the last member to arrive and the
// transfer once all have. A slow computing rank arrives late: its peers wait, the transfer is
// normal. A slow link or NIC makes the transfer of every group using it slow. So groups are
// compared on their transfer time (the members' median), against the other groups that ran
// the same collective in the same size class, with robust timing consensus (a class of
// exactly two groups, as one dimension of an 8-rank 4 x 2 mesh has, compares the pair
// directly: the slower is an outlier when it is slower by the absolute threshold and by
// `pair_relative_threshold` of the faster); a group is slow once confirmed over rounds as
// compute stragglers are (lmr::replay::StragglerTracker). Slow
// groups that intersect at exactly one rank, with no healthy group containing that rank,
// name it; the resource map gives its host, the manager's replacement scope.
//
// Not thread-safe (CommTracker); the rest are pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/consensus/consensus.h"
#include "lmr/replay/replay.h"

namespace lmr::mesh {

// Where a rank runs. `host` is always known; `nic` and `switch_name` only from a map file.
struct Resources {
  std::string host;
  std::string nic;
  std::string switch_name;
  bool operator==(const Resources&) const = default;
};

// Ranks to resources. The file format (strict JSON; an error names the JSON path):
//   {"version": 1,
//    "ranks": {"0": {"host": "node-a", "nic": "mlx5_0", "switch": "leaf-1"},
//              "1": {"host": "node-a"}, ...}}
// Every rank of the world appears exactly once; "host" is required, "nic" and "switch" are
// optional non-empty strings; no other keys.
class ResourceMap {
 public:
  // Throws InvalidArgument naming the JSON path of what is wrong.
  static ResourceMap fromJson(std::string_view text, std::int64_t world_size);
  // Host names gathered from every rank, by rank (no NIC or switch known).
  static ResourceMap fromHosts(const std::vector<std::string>& hosts);

  const Resources& of(std::int64_t rank) const;  // InvalidArgument for a rank outside the world
  std::int64_t worldSize() const { return static_cast<std::int64_t>(ranks_.size()); }

 private:
  std::vector<Resources> ranks_;
};

// One call of one collective by one process group, timed on every member.
struct CollectiveObservation {
  std::string group;                  // a stable id of the process group ("dp_shard:2")
  std::vector<std::int64_t> members;  // global ranks
  std::string collective;             // "all_reduce", "fsdp_parameter_all_gather", ...
  std::uint64_t bytes = 0;            // payload per member
  std::vector<double> wait;           // by member: seconds waiting for the last to arrive
  std::vector<double> transfer;       // by member: seconds from the last arrival to the end
};

// One member's timing of one call, as that member recorded it (calls of a group are
// numbered in the order every member makes them). The group is named one of three ways:
// - `members` listed: `group` is its id;
// - `members` empty, `group` a key of the round's GroupTable, which names the group and
//   lists its members;
// - `members` empty, `group_size` > 0 (and no table entry): `group` is a key, and the group's
//   members are the ranks that recorded this call under it, `group_size` of them when every
//   member did (its id is "ranks:<members>", ascending). Nothing but the key and the size
//   travels: what scout/comm.py sends.
struct CollectiveRecord {
  std::string group;
  std::vector<std::int64_t> members;
  std::int64_t call = 0;
  std::string collective;
  std::uint64_t bytes = 0;
  double wait = 0;
  double transfer = 0;
  std::int64_t group_size = 0;
};

// A process group as a round's group table lists it, so that records carry a short key
// instead of the member list: gathered once per group (from its lowest member), a round's
// input grows with the sum of the group sizes, not with the sum of their squares as it does
// when every member's every record lists every member.
struct GroupEntry {
  std::string name;                   // the group's id in verdicts ("ranks:1,3,5,7")
  std::vector<std::int64_t> members;  // global ranks
};
using GroupTable = std::map<std::string, GroupEntry>;  // key -> the group

// The complete observations in every rank's records (`by_rank[r]`: what rank r recorded):
// one per (group, call) that every member recorded alike (same members, or same group size,
// and collective), timings in the members' order, bytes the most any member saw. A call
// some member did not record (timed in another round), or recorded differently, is left out,
// and so is a keyed record whose key `groups` does not list and that carries no group size.
// Sorted by (group key, call).
std::vector<CollectiveObservation> completeObservations(const std::vector<std::vector<CollectiveRecord>>& by_rank,
                                                        const GroupTable& groups = {});

// floor(log2(bytes)), 0 for 0 or 1 byte: groups of one class are compared.
std::int64_t sizeClass(std::uint64_t bytes);

struct CommOptions {
  // A group is an outlier when its transfer exceeds the median of its class by kappa robust
  // scales, 1 ms and a quarter of the median.
  consensus::TimingOptions timing{
      .kappa = 3.0, .scale_floor = 1e-4, .absolute_threshold = 1e-3, .relative_threshold = 0.25, .min_peers = 3};
  // A class of exactly two groups: the slower is an outlier when slower than the other by
  // timing.absolute_threshold and by this fraction of it (0: such pairs give no evidence).
  double pair_relative_threshold = 0.5;
  std::int64_t confirmation_rounds = 3;  // outlier rounds needed ...
  std::int64_t confirmation_checks = 5;  // ... among this many most recent rounds of the class
  std::int64_t temporal_window = 1000;   // steps
};

// What an external fabric source (NIC port counters, a switch manager) reports degraded,
// as seen from one rank: a NIC of that rank's host (named as the resource map names NICs),
// or a switch.
struct FabricFinding {
  std::int64_t reported_by = 0;  // the rank whose source reported it
  std::string kind;              // "nic" or "switch"
  std::string name;
  std::string detail;  // what was seen, e.g. "symbol_error +12"
  bool operator==(const FabricFinding&) const = default;
};

struct CommVerdict {
  std::vector<std::string> slow_groups;       // confirmed slow at this round, sorted
  std::vector<std::string> candidate_groups;  // this round's outliers, sorted
  // Members that arrived late in some group of this round (their peers waited): evidence of
  // compute stragglers, never of a slow link. Sorted, unique.
  std::vector<std::int64_t> late_ranks;
  std::optional<std::int64_t> rank;      // the one rank every slow group shares
  std::optional<Resources> resources;    // its resources (with a map): the replacement scope
  // The fabric finding that narrows the named rank to a resource below its host: its NIC
  // reported degraded by a rank of the same host, else its switch reported degraded. With
  // no rank named: the one switch reported degraded that every slow group reaches through
  // a member (the map's switch of that member).
  std::optional<FabricFinding> fabric;
  std::string reason;                    // why no rank was named while groups are slow
  std::size_t observations = 0;          // in the round
};

class CommTracker {
 public:
  explicit CommTracker(CommOptions options = {});
  // One round: every observation complete (a timing per member); a group observed several
  // times in one class counts with the median of its observations. InvalidArgument for a
  // malformed observation, a group id seen with other members, or a member outside `map`.
  // `fabric`: what the ranks' fabric sources report degraded this round (needs `map` to
  // relate NICs and switches to ranks; InvalidArgument for a kind other than "nic" or
  // "switch", an empty name, or a reporting rank outside the map).
  CommVerdict observe(std::int64_t step, const std::vector<CollectiveObservation>& round,
                      const ResourceMap* map = nullptr, const std::vector<FabricFinding>& fabric = {});

 private:
  CommOptions options_;
  replay::StragglerTracker tracker_;                        // groups as peers, one "recipe" per class
  std::map<std::string, std::int64_t> group_ids_;           // group id -> peer id for the tracker
  std::map<std::string, std::vector<std::int64_t>> members_;  // group id -> its members
};

}  // namespace lmr::mesh
