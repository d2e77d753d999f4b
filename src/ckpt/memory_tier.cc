#include "lmr/ckpt/memory_tier.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

#include "lmr/common/error.h"
#include "lmr/common/json.h"

namespace lmr::ckpt {

using json::Json;

namespace {

constexpr std::int64_t kSlotSchemaVersion = 1;
constexpr std::string_view kSlotKind = "lmr-memory-slot";

std::string sizeText(std::uint64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  char out[32];
  std::snprintf(out, sizeof(out), "%.1f MiB", static_cast<double>(bytes) / kMiB);
  return out;
}

}  // namespace

std::int64_t defaultJump(std::int64_t world, std::int64_t per_node) {
  if (per_node >= 1 && world > per_node && world % per_node == 0) return per_node;
  return 1;
}

std::int64_t nodeOf(const ReplicaRing& ring, std::int64_t rank) { return rank / ring.per_node; }

void checkRing(const ReplicaRing& ring) {
  if (ring.world < 2)
    throw InvalidArgument("the in-memory tier replicates to another rank: world size " + std::to_string(ring.world) +
                          " has none");
  if (ring.per_node < 1 || ring.world % ring.per_node != 0)
    throw InvalidArgument("ranks per node " + std::to_string(ring.per_node) + " must divide the world size " +
                          std::to_string(ring.world));
  if (ring.jump < 1 || ring.jump >= ring.world)
    throw InvalidArgument("replication jump " + std::to_string(ring.jump) + " must be in [1, " +
                          std::to_string(ring.world) + ")");
  if (ring.world == ring.per_node) return;  // one node: the replica survives a process, not the node
  for (std::int64_t r = 0; r < ring.world; ++r) {
    const std::int64_t holder = holderOf(ring, r);
    if (nodeOf(ring, holder) == nodeOf(ring, r))
      throw InvalidArgument("replication jump " + std::to_string(ring.jump) + " keeps rank " + std::to_string(r) +
                            "'s replica on its own node (rank " + std::to_string(holder) + ", " +
                            std::to_string(ring.per_node) + " ranks per node): use a jump of " +
                            std::to_string(ring.per_node));
  }
}

std::int64_t holderOf(const ReplicaRing& ring, std::int64_t rank) { return (rank + ring.jump) % ring.world; }

std::int64_t ownerOf(const ReplicaRing& ring, std::int64_t holder) {
  return ((holder - ring.jump) % ring.world + ring.world) % ring.world;
}

std::vector<std::int64_t> lostOwners(const ReplicaRing& ring, const std::vector<std::int64_t>& lost_nodes) {
  const std::set<std::int64_t> lost(lost_nodes.begin(), lost_nodes.end());
  std::vector<std::int64_t> out;
  for (std::int64_t r = 0; r < ring.world; ++r)
    if (lost.count(nodeOf(ring, r)) && lost.count(nodeOf(ring, holderOf(ring, r)))) out.push_back(r);
  return out;
}

std::uint64_t nodeBytes(const MemoryBudget& budget) {
  const auto slots = static_cast<std::uint64_t>(std::max<std::int64_t>(budget.slots, 0));
  const auto ranks = static_cast<std::uint64_t>(std::max<std::int64_t>(budget.ranks_on_node, 0));
  return slots * ranks * (budget.own_bytes + budget.held_bytes);
}

bool stageOnDevice(std::uint64_t snapshot_bytes, std::uint64_t free_device_bytes, double share) {
  if (!(share >= 0.0 && share <= 1.0)) throw InvalidArgument("staging_share must be in [0, 1]");
  return static_cast<double>(snapshot_bytes) <= share * static_cast<double>(free_device_bytes);
}

std::string checkBudget(const MemoryBudget& budget) {
  if (budget.slots < 1) return "slots must be at least 1, got " + std::to_string(budget.slots);
  if (!(budget.fraction > 0.0 && budget.fraction <= 1.0))
    return "the host memory share must be in (0, 1], got " + std::to_string(budget.fraction);
  const std::uint64_t need = nodeBytes(budget);
  const auto allowed = static_cast<std::uint64_t>(static_cast<double>(budget.host_bytes) * budget.fraction);
  if (need <= allowed) return "";
  return "the in-memory tier needs " + sizeText(need) + " on this node (" + std::to_string(budget.ranks_on_node) +
         " rank(s) x " + std::to_string(budget.slots) + " slot(s) x (" + sizeText(budget.own_bytes) + " own + " +
         sizeText(budget.held_bytes) + " held for a peer)), more than " + std::to_string(budget.fraction) + " of " +
         sizeText(budget.host_bytes) + " (" + sizeText(allowed) + "): keep fewer slots or allow a larger share";
}

RestorePlan planRestore(const std::vector<std::vector<std::int64_t>>& have, const std::vector<std::int64_t>& need) {
  if (have.size() != need.size())
    throw InvalidArgument("planRestore: " + std::to_string(have.size()) + " supply lists for " +
                          std::to_string(need.size()) + " ranks");
  const auto world = static_cast<std::int64_t>(need.size());
  std::vector<std::int64_t> sends(need.size(), 0);
  RestorePlan plan;
  std::vector<std::int64_t> missing;
  for (std::int64_t to = 0; to < world; ++to) {
    const std::int64_t owner = need[to];
    if (owner < 0) continue;
    auto holds = [&](std::int64_t r) { return std::find(have[r].begin(), have[r].end(), owner) != have[r].end(); };
    if (holds(to)) {
      plan.transfers.push_back({to, to, owner});
      continue;
    }
    std::int64_t best = -1;
    for (std::int64_t r = 0; r < world; ++r)
      if (holds(r) && (best < 0 || sends[r] < sends[best])) best = r;
    if (best < 0) {
      missing.push_back(owner);
      continue;
    }
    ++sends[best];
    plan.transfers.push_back({best, to, owner});
  }
  if (!missing.empty()) {
    plan.missing = "no rank holds the snapshot of rank(s)";
    for (std::size_t i = 0; i < missing.size(); ++i) plan.missing += (i ? ", " : " ") + std::to_string(missing[i]);
  }
  return plan;
}

std::string toJson(const SlotHeader& h) {
  return Json{{"schema_version", kSlotSchemaVersion},
              {"kind", kSlotKind},
              {"step", h.step},
              {"owner", h.owner},
              {"world", h.world},
              {"topology", h.topology},
              {"meta_bytes", h.meta_bytes},
              {"data_bytes", h.data_bytes},
              {"digest", h.digest}}
      .dump();
}

SlotHeader parseSlotHeader(std::string_view text, std::string_view source) {
  const Json v = json::parse(text, source).value;
  const std::string root;
  json::requireObject(v, root);
  json::requireKnownKeys(
      v, root, {"schema_version", "kind", "step", "owner", "world", "topology", "meta_bytes", "data_bytes", "digest"});
  auto member = [&](std::string_view key) -> const Json& { return json::requireMember(v, root, key); };
  const std::int64_t version = json::asInteger(member("schema_version"), "schema_version");
  if (version != kSlotSchemaVersion)
    json::fail("schema_version",
               "is " + std::to_string(version) + ", this version reads " + std::to_string(kSlotSchemaVersion));
  if (json::asString(member("kind"), "kind") != kSlotKind)
    json::fail("kind", "must be \"" + std::string(kSlotKind) + "\", got " + json::describe(member("kind")));
  SlotHeader h;
  h.step = json::asNonNegativeInteger(member("step"), "step");
  h.owner = json::asNonNegativeInteger(member("owner"), "owner");
  h.world = json::asPositiveInteger(member("world"), "world");
  if (h.owner >= h.world)
    json::fail("owner", "is " + std::to_string(h.owner) + ", not a rank of " + std::to_string(h.world));
  h.topology = json::asString(member("topology"), "topology");
  h.meta_bytes = static_cast<std::uint64_t>(json::asNonNegativeInteger(member("meta_bytes"), "meta_bytes"));
  h.data_bytes = static_cast<std::uint64_t>(json::asNonNegativeInteger(member("data_bytes"), "data_bytes"));
  h.digest = json::asString(member("digest"), "digest");
  if (h.digest.size() != 32 || !std::all_of(h.digest.begin(), h.digest.end(),
                                            [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
    json::fail("digest", "must be 32 hex digits, got " + json::describe(member("digest")));
  return h;
}

}  // namespace lmr::ckpt
