// Logical mesh addresses and peer groups. A framework adapter describes its parallelism as
// named dimensions (row-major over global ranks, as torch's DeviceMesh lays them out); this
// decides which ranks are equivalent peers for consensus: ranks with equal coordinates on
// every dimension except the replicated data dimensions. With no replicated dimension
// (pure FSDP / ZeRO-3), the data-sharded dimensions form the peer groups and the evidence
// must be materialized (gathered) before peers can compare it. An expert dimension (MoE
// expert parallelism) replicates dense state but not experts: its ranks are compute peers,
// not state peers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lmr::mesh {

enum class Role : std::uint8_t {
  kReplicate,  // data-parallel replicas holding identical state (DDP, HSDP dp_replicate)
  kShard,      // data-parallel shards (FSDP dp_shard)
  kModel,      // TP / PP / CP: peers must share this coordinate
  // Expert parallelism (MoE): dense state is replicated along it, experts are not. Ranks
  // along it compute the same dense modules (compute peers) but hold different experts, so
  // they are not state peers; expert replay compares ranks that share this coordinate.
  kExpert,
};

struct Dim {
  std::string name;
  std::int64_t size = 1;
  Role role = Role::kReplicate;
};

class Layout {
 public:
  // Throws InvalidArgument for empty or non-positive dimensions, duplicate names, or a
  // product of sizes different from world_size.
  Layout(std::vector<Dim> dims, std::int64_t world_size);

  const std::vector<Dim>& dims() const { return dims_; }
  std::int64_t worldSize() const { return world_; }
  std::vector<std::int64_t> coordinates(std::int64_t rank) const;
  std::int64_t rankOf(const std::vector<std::int64_t>& coordinates) const;

  // Every peer group, each a sorted list of global ranks, in a fixed order (by smallest
  // rank) so every process creates its communicators in the same order.
  std::vector<std::vector<std::int64_t>> peerGroups() const;
  // The group containing `rank`.
  std::vector<std::int64_t> peerGroupOf(std::int64_t rank) const;
  // Groups varying along every data-parallel dimension (replicated and sharded), model
  // coordinates fixed: the ranks that compute identical results when they replay the same
  // module on the same inputs with the same (materialized) parameters.
  std::vector<std::vector<std::int64_t>> computeGroups() const;
  // Groups varying along the data-parallel dimensions with the expert (and model)
  // coordinates fixed: the ranks holding the same experts, which compare expert replay.
  // Without an expert dimension, the compute groups.
  std::vector<std::vector<std::int64_t>> expertGroups() const;
  // Groups varying along the expert dimensions only: the ranks exchanging tokens in one
  // expert-parallel AllToAll, each in expert-parallel rank order. Without an expert
  // dimension, every rank alone.
  std::vector<std::vector<std::int64_t>> expertParallelGroups() const;
  bool hasExperts() const;
  // True when peers hold different shards of the state (no replicated dimension): their
  // parameters must be gathered into full tensors before comparison.
  bool needsMaterialization() const;

 private:
  std::vector<Dim> dims_;
  std::int64_t world_;
  std::vector<std::vector<std::int64_t>> groupsVarying(const std::vector<bool>& varying) const;
  std::vector<bool> varying_;  // dims along which state peers differ
};

}  // namespace lmr::mesh
