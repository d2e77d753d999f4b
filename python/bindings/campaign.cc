// Bindings of lmr::campaign. Structured values cross as JSON text (Python's json keeps
// 128-bit seeds exact); the Python package turns them into dicts and dataclasses.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "bindings.h"
#include "lmr/campaign/attribution.h"
#include "lmr/campaign/compare.h"
#include "lmr/campaign/journal.h"
#include "lmr/common/error.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using namespace lmr::campaign;

template <typename E, std::size_t N>
std::vector<std::string> names(const E (&values)[N]) {
  std::vector<std::string> out;
  for (E v : values) out.emplace_back(name(v));
  return out;
}

FailureType failureType(const std::string& s) {
  auto v = parseFailureType(s);
  if (!v) throw InvalidArgument("unknown failure type \"" + s + "\"");
  return *v;
}

Surface surface(const std::string& s) {
  auto v = parseSurface(s);
  if (!v) throw InvalidArgument("unknown surface \"" + s + "\"");
  return *v;
}

std::optional<Journal> journalOrNone(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  return Journal::parse(*text, "journal");
}

// Stores used from Python through JSON text of journals.
template <typename Store>
nb::class_<Store, StateStore> bindStore(nb::module_& m, const char* name) {
  nb::class_<Store, StateStore> cls(m, name);
  cls.def("load",
          [](Store& s) -> std::optional<std::string> {
            std::optional<Journal> j;
            {
              nb::gil_scoped_release release;
              j = s.load();
            }
            if (!j) return std::nullopt;
            return j->dump();
          })
      .def(
          "compare_and_swap",
          [](Store& s, const std::optional<std::string>& expected, const std::string& updated) {
            const std::optional<Journal> e = journalOrNone(expected);
            const Journal u = Journal::parse(updated, "updated journal");
            nb::gil_scoped_release release;
            return s.compareAndSwap(e, u);
          },
          nb::arg("expected").none(), nb::arg("updated"));
  return cls;
}

}  // namespace

void registerCampaign(nb::module_& m) {
  const FailureType all_types[] = {FailureType::kTensorCorruption,
                                   FailureType::kStaleState,
                                   FailureType::kDrop,
                                   FailureType::kDuplicate,
                                   FailureType::kReorder,
                                   FailureType::kConfigDrift,
                                   FailureType::kDelay,
                                   FailureType::kHang,
                                   FailureType::kTimeout,
                                   FailureType::kException,
                                   FailureType::kResourceExhaustion,
                                   FailureType::kProcessTermination,
                                   FailureType::kResourceUnavailable,
                                   FailureType::kCheckpointCorruption,
                                   FailureType::kCheckpointTruncation,
                                   FailureType::kCheckpointMissing,
                                   FailureType::kIoError,
                                   FailureType::kPayloadCorruption,
                                   FailureType::kCollectiveDesync,
                                   FailureType::kMessageDrop,
                                   FailureType::kNetworkPartition};
  const SafetyClass all_safety[] = {SafetyClass::kSafeInProcess, SafetyClass::kIsolatedDestructive,
                                    SafetyClass::kClusterDestructive};
  const TemporalClass all_temporal[] = {TemporalClass::kTransient, TemporalClass::kIntermittent,
                                        TemporalClass::kPermanent};
  const RecordStatus all_status[] = {
      RecordStatus::kSkippedProbability, RecordStatus::kArmed,  RecordStatus::kActive,
      RecordStatus::kCompleted,          RecordStatus::kFailed, RecordStatus::kCancelled};
  m.attr("FAILURE_TYPES") = names(all_types);
  m.attr("SAFETY_CLASSES") = names(all_safety);
  m.attr("TEMPORAL_CLASSES") = names(all_temporal);
  m.attr("RECORD_STATUSES") = names(all_status);
  std::vector<std::string> module_surfaces, parameter_surfaces;  // lmr::campaign's, for the target resolver
  for (int i = 0; i <= static_cast<int>(Surface::kConfig); ++i) {
    const auto s = static_cast<Surface>(i);
    if (isModuleSurface(s)) module_surfaces.emplace_back(name(s));
    if (isParameterSurface(s)) parameter_surfaces.emplace_back(name(s));
  }
  m.attr("MODULE_SURFACES") = nb::frozenset(nb::cast(module_surfaces));
  m.attr("PARAMETER_SURFACES") = nb::frozenset(nb::cast(parameter_surfaces));
  m.def("required_safety", [](const std::string& t, const std::string& s) {
    return std::string(name(requiredSafety(failureType(t), surface(s))));
  });
  m.def("expected_kind", [](const std::string& t, const std::string& s) {
    return std::string(expectedKind(failureType(t), surface(s)));
  });
  m.def("is_built_in_effect",
        [](const std::string& t, const std::string& s) { return isBuiltInEffect(failureType(t), surface(s)); });

  nb::class_<Campaign>(m, "Campaign")
      .def_static(
          "parse",
          [](const std::string& text, const std::string& source) {
            return std::make_shared<Campaign>(Campaign::parse(text, source));
          },
          nb::arg("text"), nb::arg("source") = "campaign")
      .def_prop_ro("name", &Campaign::name)
      .def_prop_ro("seed_text", [](const Campaign& c) { return json::int128ToString(c.seed()); })
      .def_prop_ro("identity", &Campaign::identity)
      .def_prop_ro("canonical_json", &Campaign::canonicalJson)
      .def_prop_ro("origin", [](const Campaign& c) { return std::string(name(c.origin())); })
      .def("to_json", &Campaign::toJson, nb::arg("indent") = 2)
      .def(
          "candidates",
          [](const Campaign& c, std::int64_t after, std::int64_t through, std::int64_t origin_offset) {
            std::vector<std::tuple<std::size_t, std::string, std::int64_t, std::int64_t, bool>> out;
            forEachCandidate(c, origin_offset, after, through, [&](const Candidate& cand) {
              out.emplace_back(cand.incident, c.incidents()[cand.incident].incident_id, cand.position, cand.iteration,
                               cand.selected);
            });
            return out;
          },
          nb::arg("after"), nb::arg("through"), nb::arg("origin_offset") = 0,
          "(incident index, incident_id, position, iteration, selected) of every candidate in (after, through].")
      .def(
          "check_target_overlaps",
          [](const Campaign& c, const std::function<std::string(std::size_t, std::size_t)>& key) {
            checkTargetOverlaps(c, key);
          },
          nb::arg("target_key"));

  nb::class_<StateStore>(m, "StateStore");
  bindStore<MemoryStateStore>(m, "MemoryStateStore").def(nb::init<>());
  bindStore<JsonFileStateStore>(m, "JsonFileStateStore")
      .def(nb::init<std::string>(), nb::arg("path"))
      .def_prop_ro("path", &JsonFileStateStore::path);
  nb::class_<InjectionRecord>(m, "InjectionRecord")
      .def_static(
          "from_json",
          [](const std::string& text) { return InjectionRecord::fromJson(json::parse(text, "record").value, ""); })
      .def("to_json", [](const InjectionRecord& r) { return r.toJson().dump(); })
      .def_ro("injection_id", &InjectionRecord::injection_id)
      .def_ro("occurrence_id", &InjectionRecord::occurrence_id)
      .def_prop_ro("status", [](const InjectionRecord& r) { return std::string(name(r.status)); })
      .def_prop_ro("injection_succeeded", &InjectionRecord::injectionSucceeded)
      .def("transition",
           [](InjectionRecord& r, const std::string& status) {
             auto s = parseRecordStatus(status);
             if (!s) throw InvalidArgument("unknown record status \"" + status + "\"");
             r.transition(*s);
           })
      .def("set_execution",
           [](InjectionRecord& r, const std::string& executor, bool verified,
              std::optional<std::int64_t> actual_iteration, const std::string& activation_json,
              const std::string& error) {
             r.executor = executor;
             r.verified = verified;
             r.actual_iteration = actual_iteration;
             r.activation_evidence = json::parse(activation_json, "activation evidence").value;
             r.error = error;
           })
      .def("set_deactivation", [](InjectionRecord& r, const std::string& evidence_json) {
        r.deactivation_evidence = json::parse(evidence_json, "deactivation evidence").value;
      });
  m.def(
      "make_record",
      [](const Campaign& c, std::size_t incident, std::size_t fault, std::int64_t position, std::int64_t iteration,
         bool selected, std::int64_t attempt) {
        return makeRecord(c, incident, fault, Candidate{incident, position, iteration, selected}, attempt);
      },
      nb::arg("campaign"), nb::arg("incident"), nb::arg("fault"), nb::arg("position"), nb::arg("iteration"),
      nb::arg("selected"), nb::arg("attempt"));
  m.def("validate_localization_result", [](const std::string& text) {
    return LocalizationResult::fromJson(json::parse(text, "result").value, "").toJson().dump();
  });

  nb::class_<CampaignReport>(m, "CampaignReport")
      .def("to_json", &CampaignReport::toJson, nb::arg("indent") = 2)
      .def("table", &formatReportTable)
      .def_prop_ro("all_localized", &CampaignReport::allLocalized)
      .def("score_exclusions", &scoreExclusions, nb::arg("excluded_hosts"),
           "Scores the nodes the job excluded against the records (lmr::campaign::scoreExclusions).")
      .def_prop_ro("false_exclusions", &CampaignReport::falseExclusions)
      .def_prop_ro("passed", &CampaignReport::passed)
      .def_prop_ro("totals_json", [](const CampaignReport& r) { return r.totalsJson().dump(); });

  auto parseResults = [](const std::vector<std::string>& texts) {
    std::vector<LocalizationResult> out;
    for (std::size_t i = 0; i < texts.size(); ++i)
      out.push_back(LocalizationResult::fromJson(json::parse(texts[i], "result").value, json::item("results", i)));
    return out;
  };
  m.def("evaluate", [parseResults](const Campaign& c, const std::vector<InjectionRecord>& records,
                                   const std::vector<std::string>& results) {
    return evaluate(c, records, parseResults(results));
  });
  m.def(
      "compare_artifacts",
      [](const std::vector<std::pair<std::string, std::string>>& injections, const std::string& localization,
         const std::string& localization_source) {
        std::vector<InjectionArtifact> artifacts;
        for (const auto& [source, text] : injections) artifacts.push_back(InjectionArtifact::parse(text, source));
        return compareArtifacts(artifacts, parseLocalizationArtifact(localization, localization_source));
      },
      nb::arg("injections"), nb::arg("localization"), nb::arg("localization_source") = "localization");
  m.def(
      "injection_artifact_json",
      [](std::shared_ptr<Campaign> c, std::int64_t rank, std::int64_t completed, std::int64_t clock_offset,
         const std::vector<InjectionRecord>& records) {
        InjectionArtifact a;
        a.rank = rank;
        a.completed_iterations = completed;
        a.clock_offset = clock_offset;
        a.campaign = std::move(c);
        a.records = records;
        return a.toJson(2);
      },
      nb::arg("campaign"), nb::arg("rank"), nb::arg("completed_iterations"), nb::arg("clock_offset"),
      nb::arg("records"));
  m.def("localization_artifact_json", [parseResults](const std::vector<std::string>& results) {
    return localizationArtifactJson(parseResults(results), 2);
  });

  using AttributionTuple = std::tuple<std::int64_t, std::int64_t, std::string, std::string, bool>;
  m.def(
      "occurrence_windows",
      [](const Campaign& c, const std::vector<InjectionRecord>& records, const std::vector<std::int64_t>& recoveries) {
        std::vector<std::tuple<std::string, std::int64_t, std::optional<std::int64_t>, std::vector<std::int64_t>,
                               std::vector<std::int64_t>>>
            out;
        for (auto& w : occurrenceWindows(c, records, recoveries))
          out.emplace_back(w.occurrence_id, w.first, w.last, w.ranks, w.state_ranks);
        return out;
      },
      nb::arg("campaign"), nb::arg("records"), nb::arg("recoveries"),
      "[(occurrence_id, first, last or None, ranks, state_ranks)] of every activated occurrence.");
  m.def(
      "explain_attributions",
      [](const Campaign& c, const std::vector<InjectionRecord>& records, const std::vector<AttributionTuple>& items,
         const std::vector<std::int64_t>& recoveries) {
        std::vector<Attribution> attributions;
        for (const auto& [step, rank, source, kind, state] : items)
          attributions.push_back({step, rank, source, kind, state});
        std::vector<std::pair<std::string, std::string>> out;
        for (const Explained& e : explainAttributions(c, records, attributions, recoveries))
          out.emplace_back(std::string(name(e.explanation)), e.occurrence_id);
        return out;
      },
      nb::arg("campaign"), nb::arg("records"), nb::arg("attributions"), nb::arg("recoveries"),
      "[(explanation, occurrence_id)] for [(step, rank, source, kind, state)].");
}

}  // namespace lmr::python
