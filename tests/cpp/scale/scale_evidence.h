// Synthetic evidence for the scale harness: what every rank of a World would contribute to
// each decision, with failures planted on one rank. The decisions themselves are liblmr's
// (consensus::exact and ::timing, replay::decideCheck, mesh::CommTracker, moe::decideRouting);
// nothing here decides.
//
// Healthy evidence is alike within every group that compares it (a fingerprint depends on
// the surface and the compute group only; timings carry 0.4 ms of deterministic jitter); the
// planted rank's differs the way its fault would make it differ.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/mesh/comm.h"
#include "lmr/oob/diagnose.h"
#include "lmr/oob/wire.h"
#include "lmr/replay/verdict.h"
#include "scale_world.h"

namespace lmr::scale {

struct Plant {
  std::int64_t rank = kCulprit;
  bool sdc = false;          // an SDC source: every fingerprint it computes differs
  bool slow = false;         // a slow process: its replays take 40 ms longer
  bool bad_routing = false;  // corrupts every token segment it sends in the AllToAll replay
};

// 16 bytes: a hash of the surface, the compare key (a compute group) and, when `corrupt`,
// a flipped byte.
std::string fingerprint(std::string_view surface, std::int64_t key, bool corrupt);

// Replay seconds of `rank`'s repetition `rep` at `step`: 10 ms + jitter, +40 ms when slow.
double replaySeconds(std::int64_t rank, std::int64_t step, int rep, bool slow);

// One check of compute group `g` at `step`: the recipes that ran and every peer's vote, as
// scout/harness.py gathers them. Dense recipes hidden.0, hidden.1, optimizer.0 (compute and
// state surfaces, three timed repetitions each); with experts, moe.1: the router, the two
// experts of each expert-parallel position, and the AllToAll routing vote.
struct Check {
  replay::PeerLayout layout;
  std::vector<std::string> checked;
  std::vector<replay::CheckVote> votes;  // by compute-peer position
};
Check checkOf(const World& world, std::size_t g, const Plant& plant, std::int64_t step);

// Bytes of a vote's payload (names, fingerprints, 8 bytes per timing, error texts): what a
// rank contributes to its compute group's gather, before serialization overhead.
std::size_t voteBytes(const replay::CheckVote& vote);

// Receiver `me`'s routing vote in an expert-parallel group of `ranks` under the default
// policy (moe::defaultMatrices: balanced, then the cyclic shifts of moe::defaultShifts), when
// position `bad_sender` corrupts every segment it sends (-1: nobody). Equal to
// moe::routingVote over those matrices (scale_test checks it) without building them.
std::string routingVoteOf(std::int64_t ranks, std::int64_t me, std::int64_t bad_sender);

// One round of collective records, by rank: every group along each dimension that runs
// collectives (dp_replicate all_reduce (DDP: the ddp_bucket), dp_shard reduce_scatter, tp
// all_reduce, ep all_to_all; pp runs point-to-point sends, which are not timed) times call
// `step` on each member. Groups holding `slow_rank` transfer 20 ms slower (a slow link or NIC).
// The records name their group as scout/comm.py sends them now or did before:
// - kSized (now): a 16-character key and the group's size; the members are whoever reported;
// - kTable: the key, and the group's lowest member sends its table entry (comm.py's id
//   "ranks:<members>" and the members);
// - kInline: every record carries the id and the members; the table is empty.
enum class RecordForm { kSized, kTable, kInline };
struct CommRound {
  std::vector<std::vector<mesh::CollectiveRecord>> by_rank;
  mesh::GroupTable groups;
  std::vector<std::size_t> table_bytes;  // by rank: the table entries it sends
};
CommRound commRound(const World& world, std::int64_t step, std::int64_t slow_rank, RecordForm form);

// A stall as every daemon of an n-rank peer group sees it (lmr::oob::diagnose's input): the
// group waits 31 s in one all_reduce, except `culprit`, which computes outside any collective
// (kProcess), waits in the next collective (kDesync: it skipped one), or has a DataLoader
// next() in flight for 30 s while its peers' take 10 ms (kDataloader). Hosts hold 8 ranks.
enum class Stall { kProcess, kDesync, kDataloader };
std::vector<oob::RankView> stallViews(std::int64_t n, Stall stall, std::int64_t culprit);

// A stall round's traffic at the daemons' one store and sockets, counted from the protocol
// (tools/lmr-oobd/observer.cc and gather.cc), for an n-daemon peer group with `per_host`
// daemons on each host: every daemon stores its view and waits on its host's others, one
// claims the host's list and all read it; the hosts' leaders read their hosts' views and
// mark their hosts present; the first two hosts' leaders wait on every mark, one claims the
// host list, and every leader reads it; Gloo's ring rendezvous has each leader publish its
// two pairs' addresses and read its two neighbours', then one allgather of the hosts' views;
// each leader writes the report file and the first stores it. per_host = 1 is a one-level
// round. A lower bound: waiting polls the keys still missing once; the other daemons of a
// host find the report in the state directory they share with their leader (one store
// request each otherwise, and the report's bytes).
//
// Before (d9bab94) every leader waited on every mark (hosts^2 requests) and Gloo's full mesh
// had each leader read every other leader's list of hosts - 1 addresses of 136 bytes
// (hosts^2 requests, 136 hosts^3 bytes): oobRoundCostFullMesh counts that round.
struct OobRoundCost {
  double store_requests = 0;       // at the store, over the round
  double store_bytes = 0;          // payload through the store
  double sockets_per_leader = 0;   // TCP connections of one leader's Gloo context (others: none)
  double view_bytes_received = 0;  // allgather: what one leader receives
};
OobRoundCost oobRoundCost(std::int64_t n, std::size_t report_bytes, std::int64_t per_host = 1);
OobRoundCost oobRoundCostFullMesh(std::int64_t n, std::size_t report_bytes, std::int64_t per_host = 1);

// Bytes of a record's payload (group id or key, 8 per member, collective, call, bytes, two
// timings, the group size).
std::size_t recordBytes(const mesh::CollectiveRecord& record);

}  // namespace lmr::scale
