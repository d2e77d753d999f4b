// The scale harness's simulated world: ranks on a named mesh (DDP, HSDP, TP x PP x DP,
// EP x DP) at any power-of-two size from 8 to 16,384, the peer groups each decision compares,
// and the one planted culprit. Nothing runs in parallel: every decision is a pure function of
// what its group gathered, and every peer of a group holds the same evidence, so a group
// decides once for all its peers (tests/cpp/replay/verdict_test.cc shows they agree).
// Shared by tests/cpp/scale/scale_test.cc (CI sizes) and bench/scale_bench.cc (full sizes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lmr/mesh/mesh.h"
#include "lmr/replay/verdict.h"

namespace lmr::scale {

enum class Mesh : std::uint8_t { kDdp, kHsdp, kTpPpDp, kEpDp };
inline constexpr Mesh kMeshes[] = {Mesh::kDdp, Mesh::kHsdp, Mesh::kTpPpDp, Mesh::kEpDp};

// "ddp", "hsdp", "tp_pp_dp", "ep_dp".
std::string meshName(Mesh mesh);

// The rank every planted failure is on, at every size and on every mesh.
inline constexpr std::int64_t kCulprit = 5;

// The dimensions of `mesh` at `world` ranks (a power of two, at least 8), row-major with the
// last innermost, as torch's DeviceMesh lays them out:
//   DDP           dp_replicate = N
//   HSDP          dp_replicate = N / s  x  dp_shard = s,       s = min(8, N / 4)
//   TP x PP x DP  pp  x  dp_replicate  x  tp,                   tp = min(8, N / 4),
//                 pp = min(16, N / (4 tp)), dp the rest (8 x 16 x 128 at 16,384; dp >= 4)
//   EP x DP       dp_replicate = N / e  x  ep = e (kExpert),    e = min(8, N / 2)
// so every comparison group has at least 2 members and the check's groups at least 4 where
// the mesh allows it. InvalidArgument for a world that is not a power of two >= 8.
std::vector<mesh::Dim> dimsOf(Mesh mesh, std::int64_t world);

// The groups of a world, from lmr::mesh::Layout (never restated here).
struct World {
  Mesh kind;
  mesh::Layout layout;
  std::vector<std::vector<std::int64_t>> compute;  // Layout::computeGroups
  std::vector<std::vector<std::int64_t>> state;    // Layout::peerGroups
  std::vector<std::vector<std::int64_t>> expert;   // Layout::expertGroups (with experts)
  std::vector<std::vector<std::int64_t>> ep;       // Layout::expertParallelGroups (with experts)
  std::vector<std::size_t> compute_of;             // rank -> index of its compute group

  std::int64_t size() const { return layout.worldSize(); }
};
World makeWorld(Mesh mesh, std::int64_t world);

// The check's peer layout of compute group `g`, as scout/groups.py builds it on each of its
// ranks: the compute peers, and the state, expert and expert-parallel groups inside them.
replay::PeerLayout peerLayout(const World& world, std::size_t g);

// The groups of ranks that differ only in dimension `dim` (those that run that dimension's
// collectives), in order of their smallest rank.
std::vector<std::vector<std::int64_t>> groupsAlong(const mesh::Layout& layout, std::size_t dim);

}  // namespace lmr::scale
