#include "scale_world.h"

#include <algorithm>
#include <bit>

#include "lmr/common/error.h"

namespace lmr::scale {

std::string meshName(Mesh mesh) {
  switch (mesh) {
    case Mesh::kDdp: return "ddp";
    case Mesh::kHsdp: return "hsdp";
    case Mesh::kTpPpDp: return "tp_pp_dp";
    case Mesh::kEpDp: return "ep_dp";
  }
  return "unknown";
}

std::vector<mesh::Dim> dimsOf(Mesh mesh, std::int64_t n) {
  if (n < 8 || !std::has_single_bit(static_cast<std::uint64_t>(n)))
    throw InvalidArgument("a scale world is a power of two of at least 8 ranks, not " + std::to_string(n));
  using mesh::Role;
  switch (mesh) {
    case Mesh::kDdp: return {{"dp_replicate", n, Role::kReplicate}};
    case Mesh::kHsdp: {
      const std::int64_t s = std::min<std::int64_t>(8, n / 4);
      return {{"dp_replicate", n / s, Role::kReplicate}, {"dp_shard", s, Role::kShard}};
    }
    case Mesh::kTpPpDp: {
      const std::int64_t tp = std::min<std::int64_t>(8, n / 4);
      const std::int64_t pp = std::min<std::int64_t>(16, n / (4 * tp));
      return {{"pp", pp, Role::kModel}, {"dp_replicate", n / (tp * pp), Role::kReplicate}, {"tp", tp, Role::kModel}};
    }
    case Mesh::kEpDp: {
      const std::int64_t e = std::min<std::int64_t>(8, n / 2);
      return {{"dp_replicate", n / e, Role::kReplicate}, {"ep", e, Role::kExpert}};
    }
  }
  throw InvalidArgument("unknown mesh");
}

World makeWorld(Mesh mesh, std::int64_t n) {
  World w{mesh, mesh::Layout(dimsOf(mesh, n), n), {}, {}, {}, {}, {}};
  w.compute = w.layout.computeGroups();
  w.state = w.layout.peerGroups();
  if (w.layout.hasExperts()) {
    w.expert = w.layout.expertGroups();
    w.ep = w.layout.expertParallelGroups();
  }
  w.compute_of.assign(static_cast<std::size_t>(n), 0);
  for (std::size_t g = 0; g < w.compute.size(); ++g)
    for (std::int64_t r : w.compute[g]) w.compute_of[static_cast<std::size_t>(r)] = g;
  return w;
}

replay::PeerLayout peerLayout(const World& w, std::size_t g) {
  replay::PeerLayout l;
  l.ranks = w.compute.at(g);
  // Every state, expert and expert-parallel group lies inside one compute group: the one of
  // its first member.
  const auto inside = [&](const std::vector<std::vector<std::int64_t>>& groups) {
    std::vector<std::vector<std::int64_t>> out;
    for (const auto& group : groups)
      if (w.compute_of[static_cast<std::size_t>(group.front())] == g) out.push_back(group);
    return out;
  };
  l.state_groups = inside(w.state);
  l.expert_groups = inside(w.expert);
  l.ep_groups = inside(w.ep);
  return l;
}

std::vector<std::vector<std::int64_t>> groupsAlong(const mesh::Layout& layout, std::size_t dim) {
  const auto& dims = layout.dims();
  std::int64_t stride = 1;
  for (std::size_t d = dim + 1; d < dims.size(); ++d) stride *= dims[d].size;
  const std::int64_t size = dims.at(dim).size;
  std::vector<std::vector<std::int64_t>> out;
  for (std::int64_t r = 0; r < layout.worldSize(); ++r) {
    if ((r / stride) % size != 0) continue;  // not the group's first rank
    std::vector<std::int64_t> group;
    for (std::int64_t k = 0; k < size; ++k) group.push_back(r + k * stride);
    out.push_back(std::move(group));
  }
  return out;
}

}  // namespace lmr::scale
