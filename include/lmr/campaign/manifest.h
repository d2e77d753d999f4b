// Fault-injection campaign manifests (schema_version 1): parsing with full validation,
// canonical serialization and a stable identity.
//
// A Campaign is an immutable value: it is only produced by parse(), validated completely
// there (every error is an InvalidArgument whose message starts with the JSON path), and
// never changes afterwards, so its identity can be cached. Thread-safe for concurrent reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lmr/campaign/types.h"
#include "lmr/common/json.h"

namespace lmr::campaign {

using Json = json::Json;

struct Trigger {
  std::vector<std::int64_t> at;  // sorted, unique, positive; empty for a range
  bool is_range = false;
  std::int64_t start = 0;  // range: first candidate
  std::int64_t end = 0;    // range: last possible candidate, inclusive
  std::int64_t every = 1;  // range: spacing
  double probability = 1.0;

  std::uint64_t candidateCount() const;
  std::int64_t firstCandidate() const;
  std::int64_t lastCandidate() const;
  // The smallest candidate >= x, if any. O(log n) for `at`, O(1) for a range.
  std::optional<std::int64_t> firstAtOrAfter(std::int64_t x) const;
  bool isCandidate(std::int64_t x) const;
  // Smallest distance between consecutive candidates (nullopt for a single candidate).
  std::optional<std::int64_t> minSpacing() const;
};

struct Lifetime {
  LifetimeKind kind = LifetimeKind::kIterations;
  std::int64_t count = 1;  // matching_calls or iterations
  Until until = Until::kCampaignEnd;

  // How many consecutive iterations one occurrence may be active, starting at its
  // trigger iteration; nullopt when unbounded (until, or matching_calls > 1, whose call
  // multiplicity per iteration is not portable).
  std::optional<std::int64_t> windowIterations() const;
  // The last iteration an occurrence first active at `first` is active (nullopt while
  // unbounded): the one window the session expires effects by and scoring matches with.
  std::optional<std::int64_t> lastActiveIteration(std::int64_t first) const;
};

struct Target {
  Surface surface = Surface::kOutput;
  std::optional<std::int64_t> rank;  // as written; absent means rank 0 executes it
  std::int64_t model_part = 0;
  std::optional<std::string> component;
  std::optional<std::int64_t> index;
  std::optional<std::string> module_path;
  std::optional<std::string> operation;
  std::optional<std::string> resource;
  std::optional<std::string> path;
  // A host-bound fault lives on a node, as a broken GPU does: the rank at `local_rank` on node
  // `host` (its node id: LMR_NODE_ID, else the host name) runs it, whatever rank the job gives
  // that node after a restart, and nobody runs it once the node left the job. Not with `rank`.
  std::optional<std::string> host;
  std::optional<std::int64_t> local_rank;
  Json metadata = Json::object();

  // A rank-bound target's rank (host-bound ones: the Session resolves them by placement).
  std::int64_t executionRank() const { return rank.value_or(0); }
  // The rank a localization must report: the explicit rank; none for a resource-only or a
  // host-bound target (its record names the rank it ran on); otherwise the default rank 0.
  std::optional<std::int64_t> expectedRank() const;
};

struct Fault {
  std::string fault_id;
  FailureType type = FailureType::kTensorCorruption;
  Target target;
  Json parameters = Json::object();
};

struct Incident {
  std::string incident_id;
  Trigger trigger;
  Lifetime lifetime;
  Retrigger retrigger = Retrigger::kOnce;
  std::int64_t max_occurrences = 0;  // only with Retrigger::kMaxOccurrences
  std::vector<Fault> faults;

  TemporalClass temporalClass() const;
};

class Campaign {
 public:
  // Parses and validates a manifest. `source` names it in syntax errors.
  static Campaign parse(std::string_view text, std::string_view source = "campaign");
  static Campaign fromDocument(const json::Document& doc);

  int schemaVersion() const { return 1; }
  const std::string& name() const { return name_; }
  Int128 seed() const { return seed_; }
  ClockOrigin origin() const { return origin_; }
  const std::vector<Incident>& incidents() const { return incidents_; }
  const Json& metadata() const { return metadata_; }

  // Compact JSON with sorted keys and every default written out: equal manifests give
  // equal text whatever their key order, whitespace or omitted defaults.
  const std::string& canonicalJson() const { return canonical_; }
  // "sha256:" + hex SHA-256 of canonicalJson().
  const std::string& identity() const { return identity_; }
  // The canonical form indented for people (same content).
  std::string toJson(int indent = 2) const;
  // The canonical form as a JSON object (the seed as a decimal string if it exceeds 64 bits).
  Json toJsonValue() const;

  const Incident* findIncident(std::string_view incident_id) const;

 private:
  Campaign() = default;
  std::string serialize(int indent) const;

  std::string name_;
  Int128 seed_ = 0;
  ClockOrigin origin_ = ClockOrigin::kTrainingRun;
  std::vector<Incident> incidents_;
  Json metadata_ = Json::object();
  std::string canonical_;
  std::string identity_;
};

// The JSON form of one fault's target, as it appears in the canonical manifest.
Json targetToJson(const Target& target);

// Validates the parameters of a built-in local effect (see isBuiltInEffect); `path` is the
// JSON path of the parameters object. Throws InvalidArgument naming the offending key.
void validateBuiltInParameters(const Fault& fault, const std::string& path);

}  // namespace lmr::campaign
