// Ground truth: one InjectionRecord per fault action of an occurrence, with its lifecycle,
// what was executed, the evidence the executor returned, and what a localization system is
// expected to report for it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lmr/campaign/manifest.h"
#include "lmr/campaign/schedule.h"

namespace lmr::campaign {

struct InjectionRecord {
  std::string injection_id;   // "<occurrence_id>/<fault_id>"
  std::string occurrence_id;  // "<incident_id>@<iteration>[#<attempt>]"
  std::string incident_id;
  std::string fault_id;
  std::int64_t iteration = 0;           // the candidate as the manifest writes it
  std::int64_t training_iteration = 0;  // the same candidate in absolute training iterations
  std::optional<std::int64_t> actual_iteration;  // when the effect was activated
  std::int64_t attempt = 1;
  RecordStatus status = RecordStatus::kArmed;
  FailureType type = FailureType::kTensorCorruption;
  TemporalClass temporal_class = TemporalClass::kTransient;
  SafetyClass safety_class = SafetyClass::kSafeInProcess;
  Json target = Json::object();      // as in the canonical manifest
  Json parameters = Json::object();  // as in the canonical manifest
  std::int64_t execution_rank = 0;
  std::optional<std::int64_t> expected_rank;
  std::optional<std::string> expected_resource;
  std::optional<std::string> expected_host;  // a host-bound target's node (absent in older records)
  std::optional<std::string> expected_component;
  std::optional<std::int64_t> expected_layer;  // transformer_block index
  std::string expected_kind;
  std::string executor;             // who ran it ("" until one does)
  bool verified = false;            // the executor proved the effect happened
  Json activation_evidence;         // JSON the executor returned (null when none)
  Json deactivation_evidence;
  std::string error;                // why it failed or was cancelled

  // Active or completed, and verified.
  bool injectionSucceeded() const;
  // Moves along armed -> active -> completed, or to failed/cancelled from armed or active.
  // Throws InvalidArgument for any other move (terminal states stay terminal).
  void transition(RecordStatus next);

  Json toJson() const;
  // Strict: every key, JSON booleans, and `injection_succeeded` must agree with the status.
  static InjectionRecord fromJson(const Json& value, const std::string& path);
};

// The record of fault `fault` of incident `incident` for a candidate and attempt, filled
// from the manifest, status armed (or skipped_probability when the candidate is unselected).
InjectionRecord makeRecord(const Campaign& campaign, std::size_t incident, std::size_t fault,
                           const Candidate& candidate, std::int64_t attempt);

}  // namespace lmr::campaign
