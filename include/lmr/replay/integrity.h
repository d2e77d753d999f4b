// State integrity at every optimizer boundary: the held state (every parameter and every
// optimizer-state tensor a rank holds) checked two ways.
//
// - Replicas compare. Ranks that hold the same state (DDP ranks, HSDP's replicate peers)
//   fold the digests of their tensors after each update into one 16-byte value per kind
//   (parameters, optimizer state) and compare those with exact C3 within each state group.
// - Nothing changes at rest. Between the update that wrote the state and the next one,
//   nothing may change it: each rank signs its state again just before the next update
//   and compares with what it recorded after the last. This is the only reference a single
//   owner of a shard has (FSDP without replicas), and it breaks the tie between two
//   replicas that disagree. A tensor that changed at rest on every peer was written by the
//   job itself (code that edits parameters between steps): Inconclusive, never blamed.
//
// - In slices (optional). Each boundary may sign only a slice of the held tensors
//   (integritySlices: about 1/k of the bytes, every byte within k boundaries). A tensor not
//   signed at a boundary has an empty digest: replicas sign the same slice, so it compares
//   equal; the at-rest check compares only tensors signed both after the last update and
//   just before this one.
//
// Surfaces: "integrity.params" and "integrity.state" (held-state surfaces, isStateSource).
// A peer's vote is a fixed-size summary (one all-gather of 64 bytes); only when something
// disagrees, changed or failed do the peers exchange the detail that names the tensors.
// Pure functions over the gathered votes: every peer reaches the same verdict.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/replay/verdict.h"

namespace lmr::replay {

inline constexpr const char* kIntegrityRecipe = "integrity";
inline constexpr const char* kIntegrityParams = "integrity.params";
inline constexpr const char* kIntegrityState = "integrity.state";

// One peer's tensors at one boundary: per-tensor 16-byte digests after the update, in the
// set's order, each marked parameter (false) or optimizer state (true). An empty digest: the
// tensor was not signed then (not in the slice of that boundary).
struct HeldState {
  std::string layout;                    // 16 bytes: what the set holds (names, dtypes, shapes)
  std::vector<bool> is_state;            // by tensor
  std::vector<std::string> after;        // by tensor: digest after this update
  std::vector<std::string> reference;    // by tensor: digest after the previous update (empty: none)
  std::vector<std::string> before;       // by tensor: digest just before this update (empty: not taken)
};

// What a peer sends first: 64 bytes.
struct IntegritySummary {
  std::string layout;  // 16 bytes
  std::string params;  // 16 bytes: fold of the parameter digests after the update
  std::string state;   // 16 bytes: fold of the optimizer-state digests
  bool params_changed_at_rest = false;
  bool state_changed_at_rest = false;
  bool error = false;  // this peer could not take its digests

  std::string pack() const;                               // 64 bytes
  static IntegritySummary unpack(std::string_view bytes);  // InvalidArgument unless 64 bytes
};

// What a peer sends when the summaries call for it (integrityNeedsDetail).
struct IntegrityDetail {
  std::vector<bool> is_state;                // by tensor, as in HeldState
  std::vector<std::string> after;            // by tensor, as in HeldState
  std::vector<std::int64_t> changed_at_rest;  // tensor indices, ascending
  std::string error;                          // non-empty when the summary's error is set
};

// The order-dependent fold of per-tensor digests (16 bytes each, or empty: not signed) into
// 16 bytes.
std::string foldDigests(const std::vector<std::string>& digests);

// This peer's summary and detail. InvalidArgument when the vectors' sizes do not match or a
// digest is not 16 bytes. `reference` and `before` must be both given or both empty.
struct LocalIntegrity {
  IntegritySummary summary;
  IntegrityDetail detail;
};
LocalIntegrity localIntegrity(const HeldState& held);
// Which slice (0..slices-1) each tensor of `bytes` (by tensor, in the set's order) belongs
// to, when the state is signed in `slices` turns: the largest tensors first, each to the
// slice with the fewest bytes so far (ties to the lower slice), so the slices' bytes differ by
// at most one tensor. The same sizes give the same slices on every rank. InvalidArgument
// unless slices >= 1 and no size is negative.
std::vector<std::int64_t> integritySlices(const std::vector<std::int64_t>& bytes, std::int64_t slices);

// Worst-case steps from a replica's divergence (after some update) until a verdict names it,
// the state signed in `slices` turns: its tensor's slice comes round within `slices` steps;
// a pipelined verdict is read one boundary later. InvalidArgument unless slices >= 1.
std::int64_t integrityLatency(std::int64_t slices, bool pipelined);

// The summary of a peer that failed before it had digests (its error text in the detail).
LocalIntegrity failedIntegrity(const std::string& error);

// Whether the peers must exchange details: some peer failed or saw a change at rest, or
// replicas of one state group (when `replicas`) disagree on a layout or a fold.
bool integrityNeedsDetail(const PeerLayout& layout, bool replicas, const std::vector<IntegritySummary>& summaries);

struct IntegrityVerdict {
  CheckVerdict check;  // surfaces integrity.params / integrity.state, sdc_*, inconclusive and reasons
  // surface -> by peer position: the tensor indices that name that peer (C3 against the
  // group's majority, or changed at rest); empty lists for peers not named.
  std::map<std::string, std::vector<std::vector<std::int64_t>>> tensors;
};

// The verdict. `replicas`: the state groups hold the same state (compare them); false for
// sharded peers that hold different shards (only the at-rest check applies). `details`:
// one per peer when integrityNeedsDetail said so, else empty.
IntegrityVerdict decideIntegrity(const PeerLayout& layout, bool replicas,
                                 const std::vector<IntegritySummary>& summaries,
                                 const std::vector<IntegrityDetail>& details);

}  // namespace lmr::replay
