// SCOUTFaultReport: what the out-of-band path concluded about one stall, as the lmr-oobd
// daemons write it into the hang state directory and as a manager receives it. One writer
// (toJson) and one strict reader (parseReport) of the document:
//   {"schema_version": 1, "type": "lmr.scout_fault_report", "kind", "scope", "ranks", "hosts",
//    "missing_ranks", "evidence", "detection_latency_s", "generation", "run_id", "report_id",
//    "step", "round", "threshold_s", "peer_group", "group_ranks", "written_by"}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lmr/oob/diagnose.h"

namespace lmr::oob {

inline constexpr const char* kReportType = "lmr.scout_fault_report";

// Report kinds: the diagnosis kinds (report_kind in diagnose.h), and a daemon that died.
namespace report_kind {
inline constexpr const char* kDaemonFailure = "oob_daemon_failure";
}  // namespace report_kind

// Every report kind with the fault-injection kit's failure kind it counts as: each stall is
// a "hang" to the kit; a daemon failure localizes nothing (nullopt).
struct ReportKind {
  const char* name;
  std::optional<std::string_view> kit_kind;
};
const std::vector<ReportKind>& reportKinds();

struct ScoutFaultReport {
  std::string kind;   // a reportKinds() name
  std::string scope;  // kScopeRank or kScopePeerGroup
  std::vector<std::int64_t> ranks;
  std::vector<std::string> hosts;
  std::vector<std::int64_t> missing_ranks;
  nlohmann::json evidence;  // any JSON value (null when none)
  std::optional<double> detection_latency_s;
  std::int64_t generation = 0;
  std::string run_id;
  std::string report_id;
  std::optional<std::int64_t> step;
  std::optional<std::int64_t> round;
  std::optional<double> threshold_s;
  std::string peer_group;
  std::vector<std::int64_t> group_ranks;
  std::optional<std::int64_t> written_by;
  bool operator==(const ScoutFaultReport&) const = default;

  // The report of a diagnosis (kind, scope, ranks, hosts, missing ranks, evidence).
  static ScoutFaultReport of(const FaultReport& fault);
};

// Throws InvalidArgument naming the field when kind or scope is not in the vocabulary.
void validate(const ScoutFaultReport& report);

// Every field, absent optionals as null, with schema_version and type.
nlohmann::json toJson(const ScoutFaultReport& report);

// Strict: an object with only the keys above; kind, scope, ranks and hosts required (the
// rest default as in ScoutFaultReport); type, when present, kReportType; schema_version,
// when present, 1; integers where integers are due (null allowed for step, round,
// written_by; numbers or null for detection_latency_s and threshold_s). Throws
// InvalidArgument whose message starts with the JSON path of what is wrong
// ("ranks[1]: ...").
ScoutFaultReport parseReport(const nlohmann::json& document);
// The same from text; `source` names the input in syntax errors (a file path).
ScoutFaultReport parseReport(std::string_view text, std::string_view source);

}  // namespace lmr::oob
