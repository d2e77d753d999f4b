// The restart journal: how many times each campaign candidate has fired, kept in a state
// store that survives worker replacement, so `retrigger: once` holds across restarts.
//
// A journal is {campaign, manifest_identity, attempts}; attempts maps the candidate key
// "<incident_id>@<iteration>" (no leading zeros) to a positive count. Stores offer an atomic
// compare-and-swap, so of two workers claiming the same candidate exactly one wins.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "lmr/campaign/manifest.h"
#include "lmr/common/mutex.h"

namespace lmr::campaign {

struct Journal {
  std::string campaign;
  std::string manifest_identity;
  std::map<std::string, std::int64_t> attempts;

  // Strict: exactly the three keys, canonical attempt keys, positive integer counts.
  // Errors start with the JSON path, prefixed by `source`.
  static Journal fromJson(const Json& value, std::string_view source = "journal");
  static Journal parse(std::string_view text, std::string_view source = "journal");
  static Journal fresh(const Campaign& campaign);
  Json toJson() const;
  std::string dump() const;  // canonical text

  std::int64_t attemptsAt(std::string_view incident_id, std::int64_t position) const;
  bool operator==(const Journal&) const = default;
};

// Throws InvalidArgument when the journal belongs to another campaign, to an edited
// manifest (stale: its identity differs), or records attempts the manifest cannot have made.
void checkJournalBinding(const Journal& journal, const Campaign& campaign);

// The attempt number the candidate at `position` fires as next (1 for a first firing), or
// nullopt when the incident's retrigger policy allows no further attempt.
std::optional<std::int64_t> nextAttempt(const Incident& incident, std::int64_t position, const Journal& journal);

// `journal` with the candidate's count set to `attempt`.
Journal withAttempt(Journal journal, std::string_view incident_id, std::int64_t position, std::int64_t attempt);

// Rejects a swap between journals of different campaigns, or to an invalid journal,
// before any storage is touched.
void checkJournalSwap(const std::optional<Journal>& expected, const Journal& updated);

// Where journals live. Implementations must make compareAndSwap atomic across every worker
// that shares the store: it replaces the stored journal by `updated` only when the stored
// one equals `expected` (nullopt: nothing stored yet) and reports whether it did.
class StateStore {
 public:
  virtual ~StateStore() = default;
  virtual std::optional<Journal> load() = 0;
  virtual bool compareAndSwap(const std::optional<Journal>& expected, const Journal& updated) = 0;
};

// In one process. Thread-safe.
class MemoryStateStore final : public StateStore {
 public:
  std::optional<Journal> load() override;
  bool compareAndSwap(const std::optional<Journal>& expected, const Journal& updated) override;

 private:
  Mutex mu_;
  std::optional<Journal> journal_ LMR_GUARDED_BY(mu_);
};

// A JSON file shared by processes. Each swap holds an exclusive lock on "<path>.lock"
// (flock), writes a temporary file beside the journal, fsyncs it, renames it over the
// journal and fsyncs the directory before it returns true: a reader sees the old or the
// new journal, never a torn one, whenever a writer dies. Blocks while another process holds
// the lock. Thread-safe and process-safe.
class JsonFileStateStore final : public StateStore {
 public:
  explicit JsonFileStateStore(std::string path);
  const std::string& path() const { return path_; }
  std::optional<Journal> load() override;
  bool compareAndSwap(const std::optional<Journal>& expected, const Journal& updated) override;

 private:
  std::optional<Journal> readUnlocked() const;
  std::string path_;
};

}  // namespace lmr::campaign
