#include "lmr/mesh/mesh.h"

#include <algorithm>
#include <map>
#include <set>

#include "lmr/common/error.h"

namespace lmr::mesh {

Layout::Layout(std::vector<Dim> dims, std::int64_t world_size) : dims_(std::move(dims)), world_(world_size) {
  if (dims_.empty()) throw InvalidArgument("a mesh needs at least one dimension");
  std::set<std::string> names;
  std::int64_t product = 1;
  for (const Dim& d : dims_) {
    if (d.size < 1) throw InvalidArgument("mesh dimension '" + d.name + "' has size " + std::to_string(d.size));
    if (!names.insert(d.name).second) throw InvalidArgument("mesh dimension '" + d.name + "' appears twice");
    product *= d.size;
  }
  if (product != world_size) {
    throw InvalidArgument("mesh dimensions multiply to " + std::to_string(product) + ", the world has " +
                          std::to_string(world_size) + " ranks");
  }
  const bool any_replicate =
      std::any_of(dims_.begin(), dims_.end(), [](const Dim& d) { return d.role == Role::kReplicate; });
  for (const Dim& d : dims_) varying_.push_back(any_replicate ? d.role == Role::kReplicate : d.role == Role::kShard);
}

std::vector<std::int64_t> Layout::coordinates(std::int64_t rank) const {
  if (rank < 0 || rank >= world_) throw InvalidArgument("rank " + std::to_string(rank) + " is outside the mesh");
  std::vector<std::int64_t> c(dims_.size());
  for (std::size_t i = dims_.size(); i-- > 0;) {
    c[i] = rank % dims_[i].size;
    rank /= dims_[i].size;
  }
  return c;
}

std::int64_t Layout::rankOf(const std::vector<std::int64_t>& c) const {
  if (c.size() != dims_.size()) throw InvalidArgument("coordinates do not match the mesh dimensions");
  std::int64_t rank = 0;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (c[i] < 0 || c[i] >= dims_[i].size)
      throw InvalidArgument("coordinate outside mesh dimension '" + dims_[i].name + "'");
    rank = rank * dims_[i].size + c[i];
  }
  return rank;
}

std::vector<std::vector<std::int64_t>> Layout::peerGroups() const { return groupsVarying(varying_); }

std::vector<std::vector<std::int64_t>> Layout::computeGroups() const {
  std::vector<bool> data;
  for (const Dim& d : dims_) data.push_back(d.role != Role::kModel);
  return groupsVarying(data);
}

std::vector<std::vector<std::int64_t>> Layout::expertGroups() const {
  std::vector<bool> data;
  for (const Dim& d : dims_) data.push_back(d.role == Role::kReplicate || d.role == Role::kShard);
  return groupsVarying(data);
}

std::vector<std::vector<std::int64_t>> Layout::expertParallelGroups() const {
  std::vector<bool> expert;
  for (const Dim& d : dims_) expert.push_back(d.role == Role::kExpert);
  return groupsVarying(expert);
}

bool Layout::hasExperts() const {
  return std::any_of(dims_.begin(), dims_.end(), [](const Dim& d) { return d.role == Role::kExpert; });
}

std::vector<std::vector<std::int64_t>> Layout::groupsVarying(const std::vector<bool>& varying) const {
  // Key each rank by its coordinates on the fixed (non-varying) dimensions.
  std::map<std::vector<std::int64_t>, std::vector<std::int64_t>> groups;
  for (std::int64_t r = 0; r < world_; ++r) {
    std::vector<std::int64_t> key;
    const auto c = coordinates(r);
    for (std::size_t i = 0; i < dims_.size(); ++i)
      if (!varying[i]) key.push_back(c[i]);
    groups[key].push_back(r);
  }
  std::vector<std::vector<std::int64_t>> out;
  for (auto& [key, ranks] : groups) out.push_back(std::move(ranks));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::int64_t> Layout::peerGroupOf(std::int64_t rank) const {
  for (auto& g : peerGroups())
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  throw InvalidArgument("rank " + std::to_string(rank) + " is outside the mesh");
}

bool Layout::needsMaterialization() const {
  return std::none_of(dims_.begin(), dims_.end(), [](const Dim& d) { return d.role == Role::kReplicate; });
}

}  // namespace lmr::mesh
