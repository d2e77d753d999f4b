// The SCOUTFaultReport document: writer and strict reader (see include/lmr/oob/report.h).
#include "lmr/oob/report.h"

#include "lmr/common/json.h"

namespace lmr::oob {
namespace {

using Json = nlohmann::json;
using json::child;
using json::fail;
using json::findMember;
using json::item;

std::vector<std::int64_t> integers(const Json& v, const std::string& path) {
  if (!v.is_array()) fail(path, "must be an array of integers, got " + json::describe(v));
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(json::asInteger(v[i], item(path, i)));
  return out;
}

std::vector<std::string> strings(const Json& v, const std::string& path) {
  if (!v.is_array()) fail(path, "must be an array of strings, got " + json::describe(v));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(json::asString(v[i], item(path, i)));
  return out;
}

template <typename T, typename Read>
std::optional<T> nullable(const Json& object, std::string_view key, Read read) {
  const Json* v = findMember(object, key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  return read(*v, std::string(key));
}

Json orNull(const auto& optional) { return optional ? Json(*optional) : Json(nullptr); }

}  // namespace

const std::vector<ReportKind>& reportKinds() {
  static const std::vector<ReportKind> kinds = {
      {report_kind::kCollectiveDesync, "hang"},  {report_kind::kProcessStall, "hang"},
      {report_kind::kDataloaderStall, "hang"},   {report_kind::kCheckpointIoStall, "hang"},
      {report_kind::kUnresponsiveRank, "hang"},  {report_kind::kGroupStall, "hang"},
      {report_kind::kInconclusiveStall, "hang"}, {report_kind::kDaemonFailure, std::nullopt},
  };
  return kinds;
}

ScoutFaultReport ScoutFaultReport::of(const FaultReport& fault) {
  ScoutFaultReport r;
  r.kind = fault.kind;
  r.scope = fault.scope;
  r.ranks = fault.ranks;
  r.hosts = fault.hosts;
  r.missing_ranks = fault.missing_ranks;
  r.evidence = fault.evidence;
  return r;
}

void validate(const ScoutFaultReport& r) {
  bool known = false;
  for (const ReportKind& k : reportKinds()) known = known || r.kind == k.name;
  if (!known) {
    std::string names;
    for (const ReportKind& k : reportKinds()) names += (names.empty() ? "" : ", ") + std::string(k.name);
    fail("kind", "unknown report kind \"" + r.kind + "\" (known: " + names + ")");
  }
  if (r.scope != kScopeRank && r.scope != kScopePeerGroup)
    fail("scope", "must be \"rank\" or \"peer_group\", got \"" + r.scope + "\"");
}

Json toJson(const ScoutFaultReport& r) {
  return Json{{"schema_version", 1},
              {"type", kReportType},
              {"kind", r.kind},
              {"scope", r.scope},
              {"ranks", r.ranks},
              {"hosts", r.hosts},
              {"missing_ranks", r.missing_ranks},
              {"evidence", r.evidence},
              {"detection_latency_s", orNull(r.detection_latency_s)},
              {"generation", r.generation},
              {"run_id", r.run_id},
              {"report_id", r.report_id},
              {"step", orNull(r.step)},
              {"round", orNull(r.round)},
              {"threshold_s", orNull(r.threshold_s)},
              {"peer_group", r.peer_group},
              {"group_ranks", r.group_ranks},
              {"written_by", orNull(r.written_by)}};
}

ScoutFaultReport parseReport(const Json& d) {
  json::requireKnownKeys(
      d, "",
      {"schema_version", "type", "kind", "scope", "ranks", "hosts", "missing_ranks", "evidence", "detection_latency_s",
       "generation", "run_id", "report_id", "step", "round", "threshold_s", "peer_group", "group_ranks", "written_by"});
  if (const Json* v = findMember(d, "type"); v && json::asString(*v, "type") != kReportType)
    fail("type", "not a SCOUTFaultReport (" + json::describe(*v) + ")");
  if (const Json* v = findMember(d, "schema_version"); v && json::asInteger(*v, "schema_version") != 1)
    fail("schema_version", "unsupported version " + json::describe(*v) + " (this reader knows 1)");
  ScoutFaultReport r;
  r.kind = json::asString(json::requireMember(d, "", "kind"), "kind");
  r.scope = json::asString(json::requireMember(d, "", "scope"), "scope");
  validate(r);
  r.ranks = integers(json::requireMember(d, "", "ranks"), "ranks");
  r.hosts = strings(json::requireMember(d, "", "hosts"), "hosts");
  if (const Json* v = findMember(d, "missing_ranks")) r.missing_ranks = integers(*v, "missing_ranks");
  if (const Json* v = findMember(d, "group_ranks")) r.group_ranks = integers(*v, "group_ranks");
  if (const Json* v = findMember(d, "evidence")) r.evidence = *v;
  if (const Json* v = findMember(d, "generation")) r.generation = json::asNonNegativeInteger(*v, "generation");
  if (const Json* v = findMember(d, "run_id")) r.run_id = json::asString(*v, "run_id");
  if (const Json* v = findMember(d, "report_id")) r.report_id = json::asString(*v, "report_id");
  if (const Json* v = findMember(d, "peer_group")) r.peer_group = json::asString(*v, "peer_group");
  r.detection_latency_s = nullable<double>(d, "detection_latency_s", json::asNumber);
  r.threshold_s = nullable<double>(d, "threshold_s", json::asNumber);
  r.step = nullable<std::int64_t>(d, "step", json::asInteger);
  r.round = nullable<std::int64_t>(d, "round", json::asInteger);
  r.written_by = nullable<std::int64_t>(d, "written_by", json::asInteger);
  return r;
}

ScoutFaultReport parseReport(std::string_view text, std::string_view source) {
  return parseReport(json::parse(text, source).value);
}

}  // namespace lmr::oob
