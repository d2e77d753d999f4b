// The trust manifest of a job's checkpoints: every captured state, its trust, and the last
// recovery decision. One writer rank owns the file; it is replaced atomically and durably
// (temp file, fsync, rename, fsync of the directory), so a reader sees the previous or the
// next manifest, never a torn one. Parsing is strict: an error names the JSON path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmr::ckpt {

// LATEST: captured, not validated (usable for an accessible straggler, or after a clean
// emergency replay). CANDIDATE: captured at the end of a complete accepted catalog cycle.
// RECOVERY_VERIFIED: a candidate the following complete cycle accepted, or a state a dense
// accepted check covered. REJECTED: SDC or a rollback made it unusable; kept for the record.
enum class TrustState { kLatest, kCandidate, kRecoveryVerified, kRejected };
std::string_view name(TrustState state) noexcept;

// durable: the framework's checkpoint store (save_candidate / load_checkpoint). latest: the
// node-local fast tier.
enum class Tier { kDurable, kLatest };
std::string_view name(Tier tier) noexcept;
// From the names above; InvalidArgument listing the accepted names.
TrustState parseTrustState(std::string_view text);
Tier parseTier(std::string_view text);

struct Checkpoint {
  std::string id;        // unique in the manifest, e.g. "durable-120", "latest-125"
  std::int64_t step = 0;  // optimizer steps completed when it was captured
  Tier tier = Tier::kDurable;
  TrustState state = TrustState::kLatest;
  std::string location;  // what the tier's load understands (a path)
  std::string topology;  // digest of the job topology it was saved under (hex)
  std::string reason;    // why it has its state
  std::int64_t certified_at = -1;  // step of the check that made it CANDIDATE or RECOVERY_VERIFIED
  bool operator==(const Checkpoint&) const = default;
};

// What to resume from, decided by selectRecovery (recovery.h).
struct RecoveryDecision {
  std::string mode;     // "rollback_verified", "resume_latest" or "unavailable"
  std::string source;   // the trust state selected: "RECOVERY_VERIFIED", "LATEST" (any usable), or ""
  std::string failure;  // the failure it answers: sdc, inaccessible, straggler, hang, uncertain
  std::int64_t decided_at = 0;     // step at which it was decided
  double decided_time = 0.0;       // when (seconds since the epoch), for recovery-time figures
  std::int64_t step = -1;          // the checkpoint's step, -1 when unavailable
  std::string checkpoint_id;       // the checkpoint's id, "" when unavailable
  std::string location;
  std::string tier;                // "durable" or "latest", "" when unavailable
  std::string topology;            // the checkpoint's topology digest
  bool available = false;
  std::string reason;
  std::string status = "pending";  // "pending" until the relaunched job loaded it, then "applied"
  // Whether the ranks leave for a relaunch when self-healing is on: an SDC leaves the running
  // state tainted, so the job must go back; other failures already stopped or slowed the job
  // and its launcher restarts it. Manifests written before this field read it so.
  bool restart = false;
  // What recovery does about who the failure blames (lmr::ckpt::decideExclusion, exclusion.h):
  // "rollback", "exclude_and_rollback" or "escalate" (the job stops: it cannot heal), and the
  // blamed ranks and their hosts. Manifests written before these fields read "rollback", none.
  std::string action = "rollback";
  std::vector<std::int64_t> blamed_ranks;
  std::vector<std::string> blamed_hosts;
  bool operator==(const RecoveryDecision&) const = default;
};

struct Manifest {
  std::string topology;                       // the job's topology digest (hex)
  std::int64_t generation = 0;                // recoveries applied so far
  std::optional<std::int64_t> tainted_since;  // SDC detected at this step and not recovered from
  std::vector<Checkpoint> checkpoints;        // ascending by step, then capture order
  std::optional<RecoveryDecision> decision;   // the last one
  std::vector<RecoveryDecision> history;      // the ones before it, oldest first (at most kDecisionHistory)
  bool operator==(const Manifest&) const = default;

  Checkpoint* find(std::string_view id);
  const Checkpoint* find(std::string_view id) const;
  // Makes `d` the decision; the one it replaces (unless it is `d` itself) joins the history.
  void setDecision(RecoveryDecision d);
};

// Version 2 added the decision history; a version 1 manifest reads with an empty one.
inline constexpr int kManifestSchemaVersion = 2;
inline constexpr std::size_t kDecisionHistory = 64;

std::string toJson(const Manifest& manifest, int indent = 2);
// Strict: schema_version, kind, every field typed, unknown keys, duplicate ids and steps out
// of order rejected. InvalidArgument naming the JSON path ("checkpoints[2].state: ...").
Manifest parseManifest(std::string_view text, std::string_view source = "manifest");
std::string toJson(const RecoveryDecision& decision, int indent = -1);
RecoveryDecision parseDecision(std::string_view text, std::string_view source = "decision");

// The manifest file inside a checkpoint directory.
std::string manifestPath(const std::string& directory);
// Atomic, durable replacement (creates the directory). IoError on failure; the previous
// manifest is then still intact.
void writeManifest(const std::string& directory, const Manifest& manifest);
// nullopt when the directory has no manifest yet; InvalidArgument when it is malformed.
std::optional<Manifest> readManifest(const std::string& directory);

}  // namespace lmr::ckpt
