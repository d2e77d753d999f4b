// Exclusion: what recovery does about who a failure blames. A rollback alone heals a fault that
// goes away; a broken GPU faults again after every rollback. The decision counts how often the
// same host was blamed for the same kind of failure across the job's generations, and excludes
// the host when the policy says the evidence is enough: an SDC attributed again after a rollback
// (by default), a fatal health event at once, a hang culprit on recurrence, a confirmed
// straggler only when asked to. It never excludes on inconclusive evidence, never more hosts than
// the policy allows, never below the rendezvous minimum; where it cannot heal it escalates (the
// job stops with a reason) instead of rolling back forever.
//
// The ledger (lmr-exclusions.json next to the trust manifest) keeps every blame acted on and
// every host excluded, keyed by host name (the replacement scope), never by rank or pid. Pure
// functions and strict JSON; not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/ckpt/manifest.h"
#include "lmr/ckpt/recovery.h"

namespace lmr::ckpt {

enum class BlameKind { kSdc, kComputeStraggler, kCommStraggler, kHealth, kHang };
std::string_view name(BlameKind kind) noexcept;
BlameKind parseBlameKind(std::string_view text);  // InvalidArgument naming the accepted values

// Who one failure blames, as the evidence says it.
struct Blame {
  BlameKind kind = BlameKind::kSdc;
  std::vector<std::int64_t> ranks;   // the blamed ranks
  std::vector<std::string> hosts;    // their hosts (the replacement scope), distinct
  std::vector<std::string> sources;  // evidence: surfaces, health events, report kinds
  std::int64_t step = 0;
  std::int64_t generation = 0;  // the manifest generation it was found in
  bool confirmed = true;        // false: inconclusive evidence, which never excludes
  bool fatal = false;           // a health event that the device cannot recover from (XID, ECC, row remap)
  bool operator==(const Blame&) const = default;
};

enum class Action { kRollback, kExcludeAndRollback, kEscalate, kWarn };
std::string_view name(Action action) noexcept;

// What the job's owner decides once, as data (strict JSON, every field optional).
struct RecoveryPolicy {
  std::int64_t sdc_exclude_after = 2;        // a host's Nth SDC attribution excludes it (1: the first)
  bool straggler_exclude = false;            // confirmed stragglers: warn (default) or exclude ...
  std::int64_t straggler_exclude_after = 3;  // ... at the Nth confirmation of the same host
  bool health_fatal_exclude = true;          // a fatal health event excludes its host at once
  std::int64_t hang_exclude_after = 2;       // a host's Nth hang or stall blame excludes it
  std::int64_t max_excluded = 1;             // hosts excluded over the job's life
  std::int64_t min_nodes = 1;                // the rendezvous minimum (torchrun --nnodes MIN:MAX)
  std::int64_t max_identical = 3;            // the same decision this many times: escalate instead
  bool in_process = true;                    // a rollback on healthy processes loads in place (no relaunch)
  bool hang_relaunch = true;                 // a diagnosed hang ends the job now, for the relaunch
  bool operator==(const RecoveryPolicy&) const = default;
};
// InvalidArgument naming the JSON path of an unknown key or a bad value.
RecoveryPolicy parsePolicy(std::string_view text, std::string_view source = "policy");
std::string toJson(const RecoveryPolicy& policy, int indent = 2);

struct ExclusionDecision {
  Action action = Action::kRollback;
  BlameKind kind = BlameKind::kSdc;
  std::vector<std::string> hosts;    // the blamed hosts
  std::vector<std::string> exclude;  // the hosts excluded now (kExcludeAndRollback)
  std::int64_t occurrence = 0;       // how many times these hosts were blamed for this kind, this one included
  std::string reason;
  bool operator==(const ExclusionDecision&) const = default;
};

struct ExcludedHost {
  std::string host;
  BlameKind kind = BlameKind::kSdc;
  std::vector<std::int64_t> ranks;
  std::int64_t step = 0;
  std::int64_t generation = 0;
  std::string reason;
  bool operator==(const ExcludedHost&) const = default;
};

struct ExclusionLedger {
  std::vector<Blame> history;                // every blame decided on, oldest first
  std::vector<ExclusionDecision> decisions;  // by history entry
  std::vector<ExcludedHost> excluded;
  bool isExcluded(std::string_view host) const;
  bool operator==(const ExclusionLedger&) const = default;
};

inline constexpr int kExclusionSchemaVersion = 1;
std::string toJson(const ExclusionLedger& ledger, int indent = 2);
ExclusionLedger parseLedger(std::string_view text, std::string_view source = "ledger");
std::string ledgerPath(const std::string& directory);  // <directory>/lmr-exclusions.json
// Atomic (complete or absent, like the manifest); readLedger: an empty ledger when there is none.
void writeLedger(const std::string& directory, const ExclusionLedger& ledger);
ExclusionLedger readLedger(const std::string& directory);

// Decides what to do about `blame` and records it (history, decision, and any host excluded) in
// `ledger`. `nodes`: the nodes the job runs on now. InvalidArgument for a blame without ranks, a
// blamed host the job does not run on (already excluded), or a policy out of range.
ExclusionDecision decideExclusion(const RecoveryPolicy& policy, ExclusionLedger& ledger, const Blame& blame,
                                  std::int64_t nodes);

// What a culprit found outside an SDC verdict leads to: the failure its recovery decision is for
// (a fatal health event: inaccessible; a straggler: straggler; a hang: hang), and whether every
// rank leaves for the relaunch now: on an exclusion, and on a fatal health event's escalation
// (the device cannot go on); a straggler that cannot be excluded keeps training. A hang is not
// acted on here, at a check (the training thread is stuck): see endsHang.
struct CulpritResponse {
  Failure failure = Failure::kUncertain;
  bool leave = false;
};
CulpritResponse respondTo(const ExclusionDecision& exclusion, bool fatal);

// Whether `decision`, which sends the ranks back to a checkpoint, is carried out in the running
// processes (each loads the checkpoint in place and training goes on) instead of a relaunch:
// only a plain rollback after an SDC or a straggler, when every process, device and
// communicator is still sound and no node leaves, and only when the policy allows it. An
// exclusion, an escalation, a hang (a communicator may be broken), an inaccessible device and an
// uncertain failure (a crash nobody diagnosed) relaunch.
bool rollsBackInProcess(const RecoveryDecision& decision, const RecoveryPolicy& policy);

// Whether an out-of-band report of `kind` (lmr::oob's report kinds) ends the job at once, every
// rank leaving for the relaunch from its watcher thread, instead of waiting for the collective
// timeout: a stall that cannot resolve itself (a process stall, a collective desync, an
// unresponsive rank, a whole group stalled, or a stall no majority could attribute), when the
// policy's hang_relaunch is on. A DataLoader or checkpoint I/O stall (slow, still moving) and a
// daemon failure (hang detection is off for a rank, training is fine) do not.
bool endsHang(std::string_view kind, const RecoveryPolicy& policy);

// After an operator repaired `host`: it leaves the excluded list, so it may join the job again
// and no longer counts against max_excluded. Its earlier blames stay in the history: blamed
// again, it is excluded at once. False (nothing changed) when `host` is not excluded.
bool readmit(ExclusionLedger& ledger, std::string_view host);

// The recovery decision that carries `exclusion` out: its action and culprit, the reason
// extended; an escalation does not send the ranks to a relaunch (restart false: the job stops),
// an exclusion always does (a straggler's or a health event's too: the node leaves with its ranks).
// An exclusion resumes on other nodes, so a fast-tier checkpoint (node-local files) gives way to
// the newest durable one `manifest` holds for the same failure; with none, it escalates; unless
// `fast_tier_survives`: the fast tier keeps a replica of every excluded rank's snapshot on a node
// that stays (the in-memory tier, memory_tier.h), so the decision keeps it.
// A warning changes nothing.
void applyExclusion(RecoveryDecision& decision, const ExclusionDecision& exclusion, const Blame& blame,
                    const Manifest& manifest, bool fast_tier_survives = false);

}  // namespace lmr::ckpt
