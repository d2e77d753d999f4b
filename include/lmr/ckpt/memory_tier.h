// The in-memory checkpoint tier (GEMINI, SOSP'23): every rank keeps its newest snapshots in host
// memory and a replica of each on a rank of another node, so a rollback reads memory and a job
// that lost a node reads the lost shards from their replicas instead of the durable tier. This
// file decides; the bytes move in Python (checkpoint/memory.py) over a gloo group of its own.
//
// - Placement: rank r's replica lives on rank (r + jump) mod world. torchrun numbers a node's
//   ranks contiguously (`per_node` of them); checkRing refuses a jump that leaves some rank's
//   replica on its own node, naming the rank (one node further, jump = per_node, never does).
// - What survives: losing some nodes loses a rank's state when its own node and its holder's
//   node are both among them (lostOwners).
// - Memory: K slots of the rank's own state plus K of the state it holds for its owner, against
//   a share of host memory (checkBudget says by how much it would exceed).
// - Restore: every rank says which owners' snapshot of a step it can supply (its own memory or
//   flushed slot, the replicas it holds) and which owner it needs; planRestore assigns a
//   supplier to every need, itself first, or says which owner nobody holds (then the job falls
//   back to the durable tier).
// - A flushed slot (written on SIGTERM or before a relaunch, so the next process on the node
//   starts from it) begins with a strict JSON header (SlotHeader).
// Pure functions; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lmr::ckpt {

struct ReplicaRing {
  std::int64_t world = 1;     // ranks in the job
  std::int64_t per_node = 1;  // ranks per node (torchrun's LOCAL_WORLD_SIZE), dividing world
  std::int64_t jump = 1;      // rank r's replica lives on (r + jump) mod world
};

// The default jump: one node further (per_node), or 1 on a single node (a replica there survives
// a process, not the node).
std::int64_t defaultJump(std::int64_t world, std::int64_t per_node);
// InvalidArgument naming the problem: world < 2, per_node not dividing world, jump outside
// [1, world), or (with more than one node) a rank whose holder is on its own node.
void checkRing(const ReplicaRing& ring);
std::int64_t holderOf(const ReplicaRing& ring, std::int64_t rank);  // who holds rank's replica
std::int64_t ownerOf(const ReplicaRing& ring, std::int64_t holder);  // whose replica holder holds
std::int64_t nodeOf(const ReplicaRing& ring, std::int64_t rank);
// The ranks whose state is gone when `lost_nodes` (node indices) are: own node and holder's both lost.
std::vector<std::int64_t> lostOwners(const ReplicaRing& ring, const std::vector<std::int64_t>& lost_nodes);

struct MemoryBudget {
  std::uint64_t own_bytes = 0;   // one snapshot of this rank's state
  std::uint64_t held_bytes = 0;  // one snapshot of the owner's state this rank holds
  std::int64_t slots = 2;        // snapshots kept of each
  std::uint64_t host_bytes = 0;  // the node's memory
  std::int64_t ranks_on_node = 1;
  double fraction = 0.25;  // the share of host memory the tier may take on a node
};
std::uint64_t nodeBytes(const MemoryBudget& budget);  // what the node's ranks keep, all slots
// "" when it fits; otherwise why not, with the sizes.
std::string checkBudget(const MemoryBudget& budget);

// Whether a CUDA capture of `snapshot_bytes` is staged in device memory first (one more
// snapshot's size there, so that the next update waits only for a device copy) under staging
// "auto": when it takes at most `share` of the device memory free at the first capture.
// InvalidArgument for a share outside [0, 1].
bool stageOnDevice(std::uint64_t snapshot_bytes, std::uint64_t free_device_bytes, double share);

// Who sends which owner's snapshot to whom. `have[r]`: the owners rank r can supply; `need[r]`:
// the owner rank r restores (-1: none).
struct Transfer {
  std::int64_t from = 0;
  std::int64_t to = 0;
  std::int64_t owner = 0;
  bool operator==(const Transfer&) const = default;
};
struct RestorePlan {
  std::vector<Transfer> transfers;  // from == to: the rank's own copy, nothing moves
  std::string missing;              // "" when every need has a supplier; else which owners nobody holds
};
// Each need is met by the rank itself when it has it, else by the rank that has it with the
// fewest copies to send so far (ties to the lower rank).
RestorePlan planRestore(const std::vector<std::vector<std::int64_t>>& have, const std::vector<std::int64_t>& need);

// The header of a flushed slot file: `header_bytes` of this JSON after an 8-byte little-endian
// length, then `meta_bytes` of metadata and `data_bytes` of tensor data.
struct SlotHeader {
  std::int64_t step = 0;
  std::int64_t owner = 0;  // the rank whose state it is
  std::int64_t world = 0;
  std::string topology;           // the job's "<model>/<layout>" when it was captured
  std::uint64_t meta_bytes = 0;   // the structure and every tensor's dtype, shape, offset and digest
  std::uint64_t data_bytes = 0;   // the tensors' bytes, back to back
  std::string digest;             // 32 hex digits: the signature of meta and data together
  bool operator==(const SlotHeader&) const = default;
};
std::string toJson(const SlotHeader& header);
// InvalidArgument naming the field ("<source>: step: ...") for anything malformed or unknown.
SlotHeader parseSlotHeader(std::string_view text, std::string_view source = "slot header");

}  // namespace lmr::ckpt
