// When a campaign's incidents are due: lazy candidate cursors, deterministic probabilistic
// selection, occurrence and injection IDs, and the overlap check the enablement step runs
// once targets are resolved.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lmr/campaign/manifest.h"

namespace lmr::campaign {

// One trigger candidate of one incident.
struct Candidate {
  std::size_t incident = 0;    // index into Campaign::incidents()
  std::int64_t position = 0;   // the iteration as the manifest writes it
  std::int64_t iteration = 0;  // absolute training iteration (position + origin offset)
  bool selected = true;        // false: skipped by the incident's probability
};

// Whether the candidate at `position` is selected: keyedUniform(seed, "campaign.select",
// {incident_id}, position) < probability (see lmr/common/keyed_hash.h). Probability 1
// always selects, 0 never does. Deterministic for a manifest.
bool isSelected(const Campaign& campaign, const Incident& incident, std::int64_t position);

// "<incident_id>@<position>", with "#<attempt>" appended for attempts after the first.
std::string occurrenceId(std::string_view incident_id, std::int64_t position, std::int64_t attempt = 1);
// "<occurrence_id>/<fault_id>".
std::string injectionId(std::string_view occurrence_id, std::string_view fault_id);

struct OccurrenceKey {
  std::string incident_id;
  std::int64_t position = 0;
  std::int64_t attempt = 1;
};
// Inverse of occurrenceId; throws InvalidArgument naming the text when malformed (leading
// zeros, non-positive numbers, "#1" written out).
OccurrenceKey parseOccurrenceId(std::string_view text);

// Cursors over every incident's candidates, ordered in a min-heap by next due iteration.
// An iteration with nothing due costs one comparison; a due candidate costs O(log n).
// Memory: one heap entry per incident with candidates left. Not thread-safe.
class Schedule {
 public:
  // origin_offset: the absolute iteration of manifest position 0 (0 for training_run; the
  // iterations completed at enablement for campaign_start). Candidates at or before
  // `completed_iterations` are treated as past.
  Schedule(std::shared_ptr<const Campaign> campaign, std::int64_t origin_offset, std::int64_t completed_iterations);

  // Every candidate due at absolute `iteration`, in incident order. Iterations passed to
  // successive calls must increase; candidates of skipped iterations are passed over.
  std::vector<Candidate> dueAt(std::int64_t iteration);
  // The next absolute iteration with a candidate, if any.
  std::optional<std::int64_t> nextDue() const;
  // Re-positions the cursors after a rollback to `completed_iterations`.
  void rewind(std::int64_t completed_iterations);

  const Campaign& campaign() const { return *campaign_; }
  std::int64_t originOffset() const { return origin_offset_; }

 private:
  using Entry = std::pair<std::int64_t, std::size_t>;  // (absolute iteration, incident)
  void seek(std::size_t incident, std::int64_t after_absolute);

  std::shared_ptr<const Campaign> campaign_;
  std::int64_t origin_offset_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
};

// Calls `visit` for every candidate with absolute iteration in (after, through], in
// (iteration, incident) order, without materialising the candidate lists.
void forEachCandidate(const Campaign& campaign, std::int64_t origin_offset, std::int64_t after, std::int64_t through,
                      const std::function<void(const Candidate&)>& visit);

// A pair of candidates (a of `a`, b of `b`) whose active windows overlap, where an
// occurrence at candidate c is active over [c, c + window - 1] (nullopt window: forever).
// Exact, and without enumerating candidates: ranges are compared arithmetically.
std::optional<std::pair<std::int64_t, std::int64_t>> firstWindowOverlap(const Trigger& a,
                                                                        std::optional<std::int64_t> window_a,
                                                                        const Trigger& b,
                                                                        std::optional<std::int64_t> window_b);

// Enablement-time check once targets are resolved: `target_key(incident, fault)` names the
// local target a fault acts on (empty: not a local target). Throws InvalidArgument when two
// faults of one incident share a key, or when incidents sharing a key can be active in the
// same iteration. Incidents with probability 0 never fire and are ignored; any other
// candidate is treated as possibly selected.
void checkTargetOverlaps(const Campaign& campaign,
                         const std::function<std::string(std::size_t incident, std::size_t fault)>& target_key);

}  // namespace lmr::campaign
