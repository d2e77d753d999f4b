#include "scale_evidence.h"
#include <cmath>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>

#include "lmr/moe/alltoall.h"
#include "lmr/oob/wire.h"

namespace lmr::scale {

namespace {

// Dense surfaces of every check: compute (output, update) and state (params, state).
const char* const kDenseSurfaces[] = {"hidden.0.output", "hidden.0.params",    "hidden.1.output",
                                      "hidden.1.params", "optimizer.0.update", "optimizer.0.state"};

// The expert dimension of a mesh (its index), or dims().size() without one.
std::size_t expertDim(const mesh::Layout& layout) {
  const auto& dims = layout.dims();
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (dims[d].role == mesh::Role::kExpert) return d;
  return dims.size();
}

// Whether ranks a and b share every coordinate except dimension `skip`.
bool sameExceptDim(const mesh::Layout& layout, std::int64_t a, std::int64_t b, std::size_t skip) {
  const std::vector<std::int64_t> ca = layout.coordinates(a), cb = layout.coordinates(b);
  for (std::size_t d = 0; d < ca.size(); ++d)
    if (d != skip && ca[d] != cb[d]) return false;
  return true;
}

std::string groupId(const std::vector<std::int64_t>& members) {
  std::string id = "ranks:";
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i > 0) id += ',';
    id += std::to_string(members[i]);
  }
  return id;
}

}  // namespace

std::string fingerprint(std::string_view surface, std::int64_t key, bool corrupt) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : surface) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::string out(16, '\0');
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + 8, &key, sizeof key);
  if (corrupt) out[3] = static_cast<char>(out[3] ^ 0x40);
  return out;
}

double replaySeconds(std::int64_t rank, std::int64_t step, int rep, bool slow) {
  return 0.010 + 0.0001 * static_cast<double>((rank * 7 + step * 3 + rep) % 5) + (slow ? 0.040 : 0.0);
}

Check checkOf(const World& w, std::size_t g, const Plant& plant, std::int64_t step) {
  Check c;
  c.layout = peerLayout(w, g);
  c.checked = {"hidden.0", "hidden.1", "optimizer.0"};
  const bool experts = w.layout.hasExperts();
  const std::size_t ep_dim = expertDim(w.layout);
  if (experts) c.checked.push_back("moe.1");
  const auto key = static_cast<std::int64_t>(g);
  for (std::int64_t rank : c.layout.ranks) {
    const bool culprit = rank == plant.rank;
    replay::CheckVote v;
    const auto put = [&](const std::string& s) { v.surfaces[s] = fingerprint(s, key, culprit && plant.sdc); };
    for (const char* s : kDenseSurfaces) put(s);
    for (const std::string& recipe : c.checked) {
      auto& reps = v.repetitions[recipe];
      for (int rep = 0; rep < 3; ++rep) reps.push_back(replaySeconds(rank, step, rep, culprit && plant.slow));
    }
    if (!experts) {
      c.votes.push_back(std::move(v));
      continue;
    }
    put("moe.1.router.output");
    put("moe.1.router.params");
    const std::int64_t ep_size = w.layout.dims()[ep_dim].size;
    const std::int64_t pos = w.layout.coordinates(rank)[ep_dim];
    for (std::int64_t e : {2 * pos, 2 * pos + 1}) {
      put("moe.1.expert." + std::to_string(e) + ".output");
      put("moe.1.expert." + std::to_string(e) + ".params");
    }
    std::int64_t bad = -1;
    if (plant.bad_routing && sameExceptDim(w.layout, rank, plant.rank, ep_dim))
      bad = w.layout.coordinates(plant.rank)[ep_dim];
    v.surfaces["moe.1.alltoall.routing"] = routingVoteOf(ep_size, pos, bad);
    c.votes.push_back(std::move(v));
  }
  return c;
}

std::size_t voteBytes(const replay::CheckVote& vote) {
  std::size_t n = 0;
  for (const auto& [name, value] : vote.surfaces) n += name.size() + value.size();
  for (const auto& [recipe, times] : vote.repetitions) n += recipe.size() + 8 * times.size();
  for (const auto& [recipe, text] : vote.errors) n += recipe.size() + text.size();
  return n;
}

std::string routingVoteOf(std::int64_t ranks, std::int64_t me, std::int64_t bad_sender) {
  const auto n = static_cast<std::size_t>(ranks);
  const std::vector<std::int64_t> shifts = moe::defaultShifts(ranks);
  std::string vote(n * (shifts.size() + 1), moe::kNoSegment);
  const auto mark = [&](std::size_t at, std::size_t sender) {
    vote[at] = static_cast<std::int64_t>(sender) == bad_sender ? moe::kCorrupted : moe::kIntact;
  };
  for (std::size_t i = 0; i < n; ++i) mark(i, i);  // the balanced matrix: every sender
  for (std::size_t s = 0; s < shifts.size(); ++s) {  // shift k: only (me - k) mod n sends to me
    const auto sender = static_cast<std::size_t>(((me - shifts[s]) % ranks + ranks) % ranks);
    mark((s + 1) * n + sender, sender);
  }
  return vote;
}

CommRound commRound(const World& w, std::int64_t step, std::int64_t slow_rank, RecordForm form) {
  CommRound out;
  out.by_rank.resize(static_cast<std::size_t>(w.size()));
  out.table_bytes.assign(static_cast<std::size_t>(w.size()), 0);
  const auto& dims = w.layout.dims();
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].size < 2 || dims[d].name == "pp") continue;
    std::string collective = "all_reduce";
    std::uint64_t bytes = 16u << 20;  // tp: activations
    switch (dims[d].role) {
      case mesh::Role::kReplicate:
        collective = dims.size() == 1 ? "ddp_bucket" : "all_reduce";
        bytes = dims.size() == 1 ? 25u << 20 : 64u << 20;
        break;
      case mesh::Role::kShard: collective = "reduce_scatter", bytes = 32u << 20; break;
      case mesh::Role::kExpert: collective = "all_to_all", bytes = 8u << 20; break;
      case mesh::Role::kModel: break;
    }
    const auto groups = groupsAlong(w.layout, d);
    for (std::size_t k = 0; k < groups.size(); ++k) {
      const auto& members = groups[k];
      const bool slow = std::find(members.begin(), members.end(), slow_rank) != members.end();
      const double transfer =
          0.010 + 0.0002 * static_cast<double>((static_cast<std::int64_t>(k) * 7 + step) % 5) + (slow ? 0.020 : 0.0);
      const std::string id = groupId(members);
      std::string key = id;
      if (form != RecordForm::kInline) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx",
                      static_cast<unsigned long long>(std::hash<std::string>{}(id)));  // comm.py: blake2b, 8 bytes
        key = hex;
      }
      if (form == RecordForm::kTable) {
        out.groups[key] = mesh::GroupEntry{id, members};
        const std::int64_t leader = *std::min_element(members.begin(), members.end());
        out.table_bytes[static_cast<std::size_t>(leader)] += key.size() + id.size() + 8 * members.size();
      }
      const auto size = form == RecordForm::kSized ? static_cast<std::int64_t>(members.size()) : 0;
      for (std::int64_t m : members)
        out.by_rank[static_cast<std::size_t>(m)].push_back(
            mesh::CollectiveRecord{key, form == RecordForm::kInline ? members : std::vector<std::int64_t>{}, step,
                                   collective, bytes, 0.0001, transfer, size});
    }
  }
  return out;
}

std::vector<oob::RankView> stallViews(std::int64_t n, Stall stall, std::int64_t culprit) {
  constexpr std::int64_t kS = 1'000'000'000;
  std::vector<oob::RankView> views(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    oob::RankView& v = views[static_cast<std::size_t>(r)];
    v.rank = r;
    v.present = true;
    v.host = "node-" + std::to_string(r / 8);
    v.snapshot.step = 120;
    v.snapshot.in_collective = true;
    v.snapshot.collective = {1, 0, 0x9e3779b97f4a7c15ull, 5, 4000};
    v.snapshot.dataloader_last_ns = kS / 100;
    v.stalled_ns = 31 * kS;
  }
  oob::RankView& bad = views[static_cast<std::size_t>(culprit)];
  switch (stall) {
    case Stall::kProcess: bad.snapshot.in_collective = false; break;
    case Stall::kDesync: bad.snapshot.collective.sequence += 1; break;
    case Stall::kDataloader:
      bad.snapshot.in_collective = false;
      bad.dataloader_ns = 30 * kS;
      bad.dataloader_observed_ns = 29 * kS;
      break;
  }
  return views;
}

namespace {

// The round up to the leaders' level, and its end, as both versions run them: every daemon's
// latest, view (set), the host list (read before waiting, claim, read after) and the m view
// keys of its host; leaders: the lead's claim, the other views of their host, their mark,
// the members (claim, read); one latest set and one report set (a count and a chunk); the
// others: one look at the stored report and at the abort mark (before the file is there).
OobRoundCost commonCost(double d, double m, double l, std::size_t report_bytes) {
  const double view = static_cast<double>(oob::kViewBytes);
  OobRoundCost c;
  c.store_requests = d * (5 + m) + (d - l) * 3 + l * 5 + 3;
  c.store_bytes = view * (d + (d - l)) + 6.0 * m * 2 * d + 6.0 * l + static_cast<double>(report_bytes);
  c.view_bytes_received = static_cast<double>(oob::kNodeSlotBytes) * m * (l - 1);
  return c;
}

constexpr double kAddressBytes = 136;  // gloo::transport::tcp::Address: sockaddr_storage and a sequence

}  // namespace

OobRoundCost oobRoundCost(std::int64_t n, std::size_t report_bytes, std::int64_t per_host) {
  const double d = static_cast<double>(n);
  const double m = static_cast<double>(std::min(per_host, n));
  const double l = std::ceil(d / m);  // hosts: one leader each
  OobRoundCost c = commonCost(d, m, l, report_bytes);
  const double deciders = std::min(2.0, l), neighbours = std::min(2.0, l - 1);
  // The deciders read the l marks, the others the list once; Gloo: l entries of two
  // addresses set, two (one with two leaders) read by each.
  c.store_requests += deciders * l + (l - deciders) + l + neighbours * l;
  c.store_bytes += 6.0 * deciders * l + 2 * kAddressBytes * l * (1 + neighbours);
  c.sockets_per_leader = neighbours;
  return c;
}

OobRoundCost oobRoundCostFullMesh(std::int64_t n, std::size_t report_bytes, std::int64_t per_host) {
  const double d = static_cast<double>(n);
  const double m = static_cast<double>(std::min(per_host, n));
  const double l = std::ceil(d / m);
  OobRoundCost c = commonCost(d, m, l, report_bytes);
  // Every leader read the l marks; Gloo: each leader set its host name and its l - 1
  // addresses, read the host names of the leaders before it and every other leader's list.
  c.store_requests += l * l + 2 * l + l * (l - 1) / 2 + l * (l - 1);
  c.store_bytes += 6.0 * l * l + kAddressBytes * (l * (l - 1) + l * (l - 1) * (l - 1)) + 16.0 * l * (l + 1) / 2;
  c.sockets_per_leader = l - 1;
  return c;
}

std::size_t recordBytes(const mesh::CollectiveRecord& r) {
  return r.group.size() + 8 * r.members.size() + r.collective.size() + 8 + 8 + 16 + (r.group_size > 0 ? 8 : 0);
}

}  // namespace lmr::scale
