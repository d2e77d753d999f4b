// State integrity verdicts: replicas comparing folds (DDP, HSDP), changes at rest breaking
// ties and standing alone for single owners (FSDP), the job's own writes, failures and
// mismatched layouts; the summary wire format and the local digest bookkeeping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/replay/integrity.h"

namespace lmr::replay {
namespace {

using consensus::Status;

std::string digest(int value) {
  std::string d(16, '\0');
  d[0] = static_cast<char>(value);
  d[1] = static_cast<char>(value >> 8);
  return d;
}

// A peer holding two parameters and one optimizer-state tensor. `offset` shifts every
// digest (a different shard); `bad` changes one tensor's value after the update;
// `rest` changes one tensor between the previous update and this one.
struct Peer {
  int offset = 0;
  std::vector<int> bad;
  std::vector<int> rest;
  bool error = false;
  std::string layout = digest(99);
};

HeldState held(const Peer& p) {
  HeldState h;
  h.layout = p.layout;
  h.is_state = {false, false, true};
  for (int t = 0; t < 3; ++t) {
    h.after.push_back(
        digest(100 + p.offset * 10 + t + (std::find(p.bad.begin(), p.bad.end(), t) != p.bad.end() ? 1000 : 0)));
    h.reference.push_back(digest(200 + p.offset * 10 + t));
    h.before.push_back(
        digest(200 + p.offset * 10 + t + (std::find(p.rest.begin(), p.rest.end(), t) != p.rest.end() ? 1000 : 0)));
  }
  return h;
}

PeerLayout layout(int n, int replicas) {  // HSDP-like: positions r and r + n / replicas ... share a shard
  PeerLayout l;
  for (int r = 0; r < n; ++r) l.ranks.push_back(r);
  const int shards = n / replicas;
  for (int s = 0; s < shards; ++s) {
    l.state_groups.emplace_back();
    for (int k = 0; k < replicas; ++k) l.state_groups.back().push_back(s + k * shards);
  }
  return l;
}

IntegrityVerdict decide(const PeerLayout& l, bool replicas, const std::vector<Peer>& peers, bool* needed = nullptr) {
  std::vector<IntegritySummary> summaries;
  std::vector<IntegrityDetail> details;
  for (const Peer& p : peers) {
    const LocalIntegrity local = p.error ? failedIntegrity("boom") : localIntegrity(held(p));
    summaries.push_back(IntegritySummary::unpack(local.summary.pack()));  // as the wire carries it
    details.push_back(local.detail);
  }
  const bool need = integrityNeedsDetail(l, replicas, summaries);
  if (needed != nullptr) *needed = need;
  return decideIntegrity(l, replicas, summaries, need ? details : std::vector<IntegrityDetail>{});
}

TEST(Integrity, ReplicasThatAgreeNeedOneSmallExchange) {
  bool needed = true;
  const IntegrityVerdict v = decide(layout(4, 4), true, std::vector<Peer>(4), &needed);
  EXPECT_FALSE(needed);
  EXPECT_EQ(v.check.status, Status::kAgree);
  EXPECT_TRUE(v.check.sdc_sources.empty());
  EXPECT_EQ(v.check.surfaces.at(kIntegrityParams).status, Status::kAgree);
  EXPECT_EQ(v.check.surfaces.at(kIntegrityState).status, Status::kAgree);
}

TEST(Integrity, ADivergedReplicaIsNamedWithItsTensor) {
  std::vector<Peer> peers(4);
  peers[2].bad = {1};
  const IntegrityVerdict v = decide(layout(4, 4), true, peers);
  EXPECT_EQ(v.check.status, Status::kAttributed);
  EXPECT_EQ(v.check.sdc_sources, std::vector<std::string>{kIntegrityParams});
  EXPECT_EQ(v.check.sdc_bitmap, (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(v.tensors.at(kIntegrityParams)[2], std::vector<std::int64_t>{1});
  EXPECT_TRUE(v.tensors.at(kIntegrityParams)[0].empty());
  EXPECT_EQ(v.check.surfaces.at(kIntegrityState).status, Status::kAgree);
}

TEST(Integrity, AReplicaDivergedInOneTensorDoesNotHideAnotherFault) {
  std::vector<Peer> peers(4);
  peers[1].bad = {0};  // diverged since an earlier fault
  peers[2].bad = {1};  // a new fault: the folds now have no strict majority
  const IntegrityVerdict v = decide(layout(4, 4), true, peers);
  EXPECT_EQ(v.check.status, Status::kAttributed);
  EXPECT_EQ(v.check.sdc_bitmap, (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(v.tensors.at(kIntegrityParams)[1], std::vector<std::int64_t>{0});
  EXPECT_EQ(v.tensors.at(kIntegrityParams)[2], std::vector<std::int64_t>{1});
  EXPECT_FALSE(v.check.surfaces.at(kIntegrityParams).split);
}

TEST(Integrity, OptimizerStateIsItsOwnSurface) {
  std::vector<Peer> peers(3);
  peers[0].bad = {2};
  const IntegrityVerdict v = decide(layout(3, 3), true, peers);
  EXPECT_EQ(v.check.sdc_sources, std::vector<std::string>{kIntegrityState});
  EXPECT_EQ(v.tensors.at(kIntegrityState)[0], std::vector<std::int64_t>{2});
}

TEST(Integrity, TwoReplicasAreTiedUntilAChangeAtRestBreaksTheTie) {
  std::vector<Peer> peers(4);  // two shards, two replicas each
  peers[1].bad = {0};
  IntegrityVerdict v = decide(layout(4, 2), true, peers);
  EXPECT_EQ(v.check.status, Status::kInconclusive);
  EXPECT_TRUE(v.check.surfaces.at(kIntegrityParams).split);
  EXPECT_NE(v.check.reasons.at(kIntegrityParams).find("no_majority"), std::string::npos);
  peers[1].rest = {0};  // the weight changed at rest on rank 1, then fed its update
  v = decide(layout(4, 2), true, peers);
  EXPECT_EQ(v.check.status, Status::kAttributed);
  EXPECT_EQ(v.check.sdc_bitmap, (std::vector<bool>{false, true, false, false}));
  EXPECT_FALSE(v.check.surfaces.at(kIntegrityParams).split);
  EXPECT_EQ(v.tensors.at(kIntegrityParams)[1], std::vector<std::int64_t>{0});
}

TEST(Integrity, ASingleOwnerIsBlamedForAChangeAtRest) {
  std::vector<Peer> peers(4);
  for (int r = 0; r < 4; ++r) peers[r].offset = r;  // different shards: folds differ, never compared
  bool needed = true;
  IntegrityVerdict v = decide(layout(4, 1), false, peers, &needed);
  EXPECT_FALSE(needed);
  EXPECT_EQ(v.check.status, Status::kAgree);
  peers[3].rest = {2};
  v = decide(layout(4, 1), false, peers);
  EXPECT_EQ(v.check.status, Status::kAttributed);
  EXPECT_EQ(v.check.sdc_sources, std::vector<std::string>{kIntegrityState});
  EXPECT_EQ(v.check.sdc_bitmap, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(v.tensors.at(kIntegrityState)[3], std::vector<std::int64_t>{2});
}

TEST(Integrity, AChangeAtRestOnEveryPeerIsTheJobsOwnWrite) {
  std::vector<Peer> peers(4);
  for (Peer& p : peers) p.rest = {0};
  const IntegrityVerdict v = decide(layout(4, 4), true, peers);
  EXPECT_EQ(v.check.status, Status::kInconclusive);
  EXPECT_TRUE(v.check.sdc_sources.empty());
  EXPECT_NE(v.check.reasons.at(kIntegrityParams).find("changed_between_steps"), std::string::npos);
  peers[1].rest = {0, 1};  // rank 1 also changed tensor 1: only it is blamed, for that tensor
  const IntegrityVerdict w = decide(layout(4, 4), true, peers);
  EXPECT_EQ(w.check.sdc_bitmap, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(w.tensors.at(kIntegrityParams)[1], std::vector<std::int64_t>{1});
}

TEST(Integrity, AFailedPeerMakesTheCheckInconclusiveEverywhere) {
  std::vector<Peer> peers(4);
  peers[2].error = true;
  const IntegrityVerdict v = decide(layout(4, 4), true, peers);
  EXPECT_EQ(v.check.status, Status::kInconclusive);
  EXPECT_EQ(v.check.inconclusive, std::vector<std::string>{kIntegrityRecipe});
  EXPECT_EQ(v.check.reasons.at(kIntegrityRecipe), "replay_error: boom (rank 2)");
}

TEST(Integrity, ReplicasWithDifferentTensorsAreNotCompared) {
  std::vector<Peer> peers(3);
  peers[1].layout = digest(98);
  peers[1].bad = {0};
  const IntegrityVerdict v = decide(layout(3, 3), true, peers);
  EXPECT_EQ(v.check.status, Status::kInconclusive);
  EXPECT_NE(v.check.reasons.at(kIntegrityParams).find("contract_mismatch"), std::string::npos);
  EXPECT_TRUE(v.check.sdc_sources.empty());
}

// Rotating slices: a boundary signs some tensors; the others have empty digests.
HeldState slice(const Peer& p, const std::vector<int>& signed_after, const std::vector<int>& signed_rest) {
  HeldState h = held(p);
  const auto in = [](const std::vector<int>& v, int t) { return std::find(v.begin(), v.end(), t) != v.end(); };
  for (int t = 0; t < 3; ++t) {
    if (!in(signed_after, t)) h.after[t].clear();
    if (!in(signed_rest, t)) h.reference[t].clear(), h.before[t].clear();
  }
  return h;
}

TEST(Integrity, ASliceComparesWhatItSignedAndNothingElse) {
  std::vector<Peer> peers(3);
  peers[1].bad = {0, 2};  // tensor 0 is in this boundary's slice, tensor 2 is not
  std::vector<IntegritySummary> summaries;
  std::vector<IntegrityDetail> details;
  for (const Peer& p : peers) {
    const LocalIntegrity local = localIntegrity(slice(p, {0, 1}, {}));
    summaries.push_back(IntegritySummary::unpack(local.summary.pack()));
    details.push_back(local.detail);
  }
  EXPECT_EQ(summaries[0].state, summaries[1].state);  // nothing of the state signed: nothing differs
  const IntegrityVerdict v = decideIntegrity(layout(3, 3), true, summaries, details);
  EXPECT_EQ(v.check.sdc_sources, std::vector<std::string>{kIntegrityParams});
  EXPECT_EQ(v.check.sdc_bitmap, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(v.tensors.at(kIntegrityParams)[1], std::vector<std::int64_t>{0});
  EXPECT_EQ(v.check.surfaces.at(kIntegrityState).status, Status::kAgree);
  // Signed or not is part of the fold: a peer that signed another slice does not agree.
  EXPECT_NE(localIntegrity(slice(Peer{}, {0, 1}, {})).summary.params,
            localIntegrity(slice(Peer{}, {0}, {})).summary.params);
}

TEST(Integrity, AtRestComparesOnlyTensorsSignedAtBothEnds) {
  Peer p;
  p.rest = {0, 1};
  HeldState h = slice(p, {0, 1, 2}, {1, 2});  // tensor 0 not signed at rest: no evidence either way
  LocalIntegrity local = localIntegrity(h);
  EXPECT_TRUE(local.summary.params_changed_at_rest);
  EXPECT_EQ(local.detail.changed_at_rest, std::vector<std::int64_t>{1});
  h.before[1].clear();  // signed after the last update but not before this one: no evidence
  local = localIntegrity(h);
  EXPECT_FALSE(local.summary.params_changed_at_rest);
  EXPECT_TRUE(local.detail.changed_at_rest.empty());
}

TEST(IntegritySlices, LargestFirstToTheLightestSlice) {
  // An embedding-like tensor, blocks of equal size, small norms.
  const std::vector<std::int64_t> bytes = {1000, 10, 400, 400, 10, 400, 400, 10};
  const std::vector<std::int64_t> s = integritySlices(bytes, 2);
  EXPECT_EQ(s, (std::vector<std::int64_t>{0, 1, 1, 1, 1, 1, 0, 1}));
  std::vector<std::int64_t> load(2, 0);
  for (std::size_t i = 0; i < bytes.size(); ++i) load[static_cast<std::size_t>(s[i])] += bytes[i];
  EXPECT_LE(std::abs(load[0] - load[1]), 1000);  // within the largest tensor
  EXPECT_EQ(integritySlices(bytes, 1), std::vector<std::int64_t>(bytes.size(), 0));
  EXPECT_EQ(integritySlices(bytes, 2), s);  // deterministic: every replica the same slices
  // More slices than tensors: some slices sign nothing.
  EXPECT_EQ(integritySlices({5, 7}, 4), (std::vector<std::int64_t>{1, 0}));
  EXPECT_TRUE(integritySlices({}, 3).empty());
  EXPECT_THROW(integritySlices(bytes, 0), InvalidArgument);
  EXPECT_THROW(integritySlices({1, -1}, 2), InvalidArgument);
}

TEST(IntegritySlices, TheWorstCaseLatencyIsOneTurnOfTheSlices) {
  EXPECT_EQ(integrityLatency(1, false), 1);  // every step signs everything
  EXPECT_EQ(integrityLatency(1, true), 2);   // read one boundary later
  EXPECT_EQ(integrityLatency(4, true), 5);
  EXPECT_THROW(integrityLatency(0, false), InvalidArgument);
}

TEST(Integrity, BadInputIsRejected) {
  EXPECT_THROW(IntegritySummary::unpack(std::string(63, '\0')), InvalidArgument);
  std::string flags(64, '\0');
  flags[48] = 8;
  EXPECT_THROW(IntegritySummary::unpack(flags), InvalidArgument);
  HeldState h = held(Peer{});
  h.after.pop_back();
  EXPECT_THROW(localIntegrity(h), InvalidArgument);
  h = held(Peer{});
  h.before.clear();
  EXPECT_THROW(localIntegrity(h), InvalidArgument);
  h = held(Peer{});
  h.reference.clear();
  h.before.clear();
  EXPECT_FALSE(localIntegrity(h).summary.params_changed_at_rest);  // no reference: no at-rest evidence
  std::vector<Peer> peers(2);
  peers[1].bad = {0};
  std::vector<IntegritySummary> summaries;
  for (const Peer& p : peers) summaries.push_back(localIntegrity(held(p)).summary);
  EXPECT_THROW(decideIntegrity(layout(2, 2), true, summaries, {}), InvalidArgument);  // needs details
  EXPECT_THROW(decideIntegrity(layout(2, 2), true, {summaries[0]}, {}), InvalidArgument);
  EXPECT_NE(foldDigests({digest(1), digest(2)}), foldDigests({digest(2), digest(1)}));
  EXPECT_EQ(foldDigests({}).size(), 16u);
  EXPECT_THROW(foldDigests({std::string(15, 'x')}), InvalidArgument);
}

}  // namespace
}  // namespace lmr::replay
