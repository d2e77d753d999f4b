#include "lmr/replay/integrity.h"

#include <algorithm>
#include <set>

#include "lmr/common/error.h"
#include "lmr/common/sha256.h"

namespace lmr::replay {
namespace {

using consensus::Status;

constexpr std::size_t kDigest = 16;
constexpr std::size_t kSummary = 64;

void checkDigests(const std::vector<std::string>& digests, std::size_t n, const char* what) {
  if (digests.size() != n)
    throw InvalidArgument(std::string("state integrity: ") + what + " has " + std::to_string(digests.size()) +
                          " digests for " + std::to_string(n) + " tensors");
  for (const std::string& d : digests)
    if (!d.empty() && d.size() != kDigest)
      throw InvalidArgument(std::string("state integrity: a digest in ") + what + " is not 16 bytes");
}

std::vector<std::size_t> positionsOf(const PeerLayout& layout, const std::vector<std::int64_t>& group) {
  std::vector<std::size_t> out;
  for (std::int64_t r : group)
    out.push_back(
        static_cast<std::size_t>(std::find(layout.ranks.begin(), layout.ranks.end(), r) - layout.ranks.begin()));
  return out;
}

const std::string& foldOf(const IntegritySummary& s, bool state) { return state ? s.state : s.params; }

// The indices of kind `state` in a detail's list `indices`.
std::set<std::int64_t> ofKind(const IntegrityDetail& d, const std::vector<std::int64_t>& indices, bool state) {
  std::set<std::int64_t> out;
  for (std::int64_t i : indices)
    if (i >= 0 && static_cast<std::size_t>(i) < d.is_state.size() && d.is_state[static_cast<std::size_t>(i)] == state)
      out.insert(i);
  return out;
}

}  // namespace

std::string IntegritySummary::pack() const {
  std::string out(kSummary, '\0');
  const auto put = [&out](std::size_t at, const std::string& d) {
    if (!d.empty() && d.size() != kDigest) throw InvalidArgument("state integrity: a summary digest is not 16 bytes");
    std::copy(d.begin(), d.end(), out.begin() + static_cast<std::ptrdiff_t>(at));
  };
  put(0, layout);
  put(16, params);
  put(32, state);
  out[48] = static_cast<char>((params_changed_at_rest ? 1 : 0) | (state_changed_at_rest ? 2 : 0) | (error ? 4 : 0));
  return out;
}

IntegritySummary IntegritySummary::unpack(std::string_view bytes) {
  if (bytes.size() != kSummary)
    throw InvalidArgument("a state-integrity summary is 64 bytes, got " + std::to_string(bytes.size()));
  IntegritySummary s;
  s.layout = std::string(bytes.substr(0, 16));
  s.params = std::string(bytes.substr(16, 16));
  s.state = std::string(bytes.substr(32, 16));
  const auto flags = static_cast<unsigned char>(bytes[48]);
  if ((flags & ~7u) != 0) throw InvalidArgument("a state-integrity summary has unknown flags");
  s.params_changed_at_rest = (flags & 1) != 0;
  s.state_changed_at_rest = (flags & 2) != 0;
  s.error = (flags & 4) != 0;
  return s;
}

std::string foldDigests(const std::vector<std::string>& digests) {
  Sha256 h;
  h.update("lmr.integrity.fold.v1");
  h.updateU64(digests.size());
  for (const std::string& d : digests) {
    if (!d.empty() && d.size() != kDigest) throw InvalidArgument("state integrity: a digest to fold is not 16 bytes");
    h.update(d.empty() ? std::string_view("\0", 1) : std::string_view("\1", 1));  // signed or not
    h.update(d);
  }
  const auto out = h.finish();
  return std::string(reinterpret_cast<const char*>(out.data()), kDigest);
}

LocalIntegrity localIntegrity(const HeldState& held) {
  const std::size_t n = held.is_state.size();
  if (held.layout.size() != kDigest) throw InvalidArgument("state integrity: the layout digest is not 16 bytes");
  checkDigests(held.after, n, "the digests after the update");
  if (held.reference.empty() != held.before.empty())
    throw InvalidArgument(
        "state integrity: the at-rest check needs both the reference and the digests before the update");
  if (!held.reference.empty()) {
    checkDigests(held.reference, n, "the reference digests");
    checkDigests(held.before, n, "the digests before the update");
  }
  LocalIntegrity out;
  std::vector<std::string> params, state;
  for (std::size_t i = 0; i < n; ++i) (held.is_state[i] ? state : params).push_back(held.after[i]);
  out.summary.layout = held.layout;
  out.summary.params = foldDigests(params);
  out.summary.state = foldDigests(state);
  for (std::size_t i = 0; i < held.reference.size(); ++i) {
    // Only a tensor signed at both ends of its rest is evidence (rotating slices).
    if (held.before[i].empty() || held.reference[i].empty() || held.before[i] == held.reference[i]) continue;
    out.detail.changed_at_rest.push_back(static_cast<std::int64_t>(i));
    (held.is_state[i] ? out.summary.state_changed_at_rest : out.summary.params_changed_at_rest) = true;
  }
  out.detail.is_state = held.is_state;
  out.detail.after = held.after;
  return out;
}

std::vector<std::int64_t> integritySlices(const std::vector<std::int64_t>& bytes, std::int64_t slices) {
  if (slices < 1) throw InvalidArgument("state integrity: the number of slices must be at least 1");
  std::vector<std::size_t> order(bytes.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (bytes[i] < 0) throw InvalidArgument("state integrity: a tensor's size is negative");
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&bytes](std::size_t a, std::size_t b) { return bytes[a] > bytes[b]; });
  std::vector<std::int64_t> load(static_cast<std::size_t>(slices), 0);
  std::vector<std::int64_t> out(bytes.size(), 0);
  for (std::size_t i : order) {
    const auto lightest = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    out[i] = static_cast<std::int64_t>(lightest);
    load[lightest] += bytes[i];
  }
  return out;
}

std::int64_t integrityLatency(std::int64_t slices, bool pipelined) {
  if (slices < 1) throw InvalidArgument("state integrity: the number of slices must be at least 1");
  return slices + (pipelined ? 1 : 0);
}

LocalIntegrity failedIntegrity(const std::string& error) {
  LocalIntegrity out;
  out.summary.error = true;
  out.detail.error = error.empty() ? "unknown error" : error;
  return out;
}

bool integrityNeedsDetail(const PeerLayout& layout, bool replicas, const std::vector<IntegritySummary>& summaries) {
  validate(layout);
  if (summaries.size() != layout.ranks.size())
    throw InvalidArgument("state integrity needs one summary per compute peer");
  for (const IntegritySummary& s : summaries)
    if (s.error || s.params_changed_at_rest || s.state_changed_at_rest) return true;
  if (!replicas) return false;
  for (const auto& group : layout.state_groups) {
    const std::vector<std::size_t> at = positionsOf(layout, group);
    for (std::size_t k : at) {
      const IntegritySummary& a = summaries[at.front()];
      const IntegritySummary& b = summaries[k];
      if (a.layout != b.layout || a.params != b.params || a.state != b.state) return true;
    }
  }
  return false;
}

IntegrityVerdict decideIntegrity(const PeerLayout& layout, bool replicas,
                                 const std::vector<IntegritySummary>& summaries,
                                 const std::vector<IntegrityDetail>& details) {
  validate(layout);
  const std::size_t n = layout.ranks.size();
  if (summaries.size() != n) throw InvalidArgument("state integrity needs one summary per compute peer");
  if (!details.empty() && details.size() != n)
    throw InvalidArgument("state integrity needs one detail per compute peer");
  if (details.empty() && integrityNeedsDetail(layout, replicas, summaries))
    throw InvalidArgument("state integrity: these summaries need the peers' details");
  IntegrityVerdict out;
  out.check = CheckVerdict::forPeers(n);
  CheckVerdict& v = out.check;
  auto inconclusive = [&v](const std::string& what, const std::string& why) { v.addInconclusive(what, why); };
  for (std::size_t i = 0; i < n; ++i) {
    if (!summaries[i].error) continue;
    const std::string text = details.empty() || details[i].error.empty() ? "digests failed" : details[i].error;
    inconclusive(kIntegrityRecipe, "replay_error: " + text + " (rank " + std::to_string(layout.ranks[i]) + ")");
    v.status = Status::kInconclusive;
    return out;
  }

  for (const bool state : {false, true}) {
    const std::string name = state ? kIntegrityState : kIntegrityParams;
    SurfaceVerdict s;
    s.bitmap.assign(n, false);
    s.evidence.assign(n, std::string());
    std::vector<std::vector<std::int64_t>> named(n);
    for (std::size_t i = 0; i < n; ++i) s.evidence[i] = foldOf(summaries[i], state);

    // Changes at rest, less those every peer made (the job's own writes).
    std::vector<std::set<std::int64_t>> changed(n);
    if (!details.empty())
      for (std::size_t i = 0; i < n; ++i) changed[i] = ofKind(details[i], details[i].changed_at_rest, state);
    std::set<std::int64_t> common = changed[0];
    for (std::size_t i = 1; i < n; ++i) {
      std::set<std::int64_t> both;
      std::set_intersection(common.begin(), common.end(), changed[i].begin(), changed[i].end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
    std::vector<bool> at_rest(n, false);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::int64_t t : changed[i])
        if (!common.count(t)) named[i].push_back(t);
      at_rest[i] = !named[i].empty();
    }
    if (!common.empty())
      inconclusive(name, "changed_between_steps: " + std::to_string(common.size()) +
                             " tensor(s) changed at rest on every peer: something besides the optimizer writes the "
                             "state between steps");

    bool split = false;
    if (replicas) {
      for (const auto& group : layout.state_groups) {
        const std::vector<std::size_t> at = positionsOf(layout, group);
        if (at.size() < 2) continue;
        const bool same_layout = std::all_of(
            at.begin(), at.end(), [&](std::size_t k) { return summaries[k].layout == summaries[at.front()].layout; });
        if (!same_layout) {
          inconclusive(name,
                       "contract_mismatch: replicas hold different parameter or optimizer-state tensors "
                       "(names, dtypes or shapes)");
          continue;
        }
        const bool folds_agree = std::all_of(at.begin(), at.end(), [&](std::size_t k) {
          return foldOf(summaries[k], state) == foldOf(summaries[at.front()], state);
        });
        if (folds_agree || details.empty()) continue;
        // Tensor by tensor: a replica diverged in one tensor (a residual of an earlier fault)
        // must not hide another replica's fault in another tensor.
        std::vector<std::int64_t> ranks;
        for (std::size_t k : at) ranks.push_back(layout.ranks[k]);
        const IntegrityDetail& first = details[at.front()];
        for (std::size_t t = 0; t < first.after.size() && t < first.is_state.size(); ++t) {
          if (first.is_state[t] != state) continue;
          const auto tensor = static_cast<std::int64_t>(t);
          std::vector<std::string> evidence;
          for (std::size_t k : at)
            evidence.push_back(t < details[k].after.size() ? details[k].after[t] : std::string());
          const consensus::ExactResult r = consensus::exact(evidence, ranks);
          std::vector<bool> blamed(at.size(), false);
          if (r.status == Status::kAttributed) {
            blamed = r.bitmap;
          } else if (r.status == Status::kInconclusive) {
            // No strict majority (two replicas, or a split): the replicas whose copy of the
            // tensor changed at rest break the tie when all the others agree and each of
            // them differs from those.
            std::set<std::string> clean_values;
            bool marked_differs = true, any_marked = false;
            for (std::size_t k = 0; k < at.size(); ++k)
              if (!changed[at[k]].count(tensor) || common.count(tensor)) clean_values.insert(evidence[k]);
            for (std::size_t k = 0; k < at.size(); ++k)
              if (changed[at[k]].count(tensor) && !common.count(tensor)) {
                any_marked = true;
                blamed[k] = true;
                marked_differs = marked_differs && !clean_values.count(evidence[k]);
              }
            if (!(any_marked && clean_values.size() == 1 && marked_differs)) {
              std::fill(blamed.begin(), blamed.end(), false);
              split = true;
            }
          }
          for (std::size_t k = 0; k < at.size(); ++k)
            if (blamed[k]) {
              s.bitmap[at[k]] = true;
              named[at[k]].push_back(tensor);
            }
        }
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::sort(named[i].begin(), named[i].end());
      named[i].erase(std::unique(named[i].begin(), named[i].end()), named[i].end());
    }
    for (std::size_t i = 0; i < n; ++i) s.bitmap[i] = s.bitmap[i] || at_rest[i];
    s.split = split;
    if (split) inconclusive(name, "no_majority: the replicas disagree and no strict majority agrees");
    const bool any = std::any_of(s.bitmap.begin(), s.bitmap.end(), [](bool b) { return b; });
    if (any) {
      s.status = Status::kAttributed;
      for (std::size_t i = 0; i < n; ++i) v.sdc_bitmap[i] = v.sdc_bitmap[i] || s.bitmap[i];
      v.sdc_sources.push_back(name);
    } else if (v.reasons.count(name)) {
      s.status = Status::kInconclusive;
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!s.bitmap[i]) named[i].clear();
    out.tensors[name] = std::move(named);
    v.surfaces.emplace(name, std::move(s));
  }
  if (std::any_of(v.sdc_bitmap.begin(), v.sdc_bitmap.end(), [](bool b) { return b; })) {
    v.status = Status::kAttributed;
  } else if (!v.inconclusive.empty()) {
    v.status = Status::kInconclusive;
  }
  return out;
}

}  // namespace lmr::replay
