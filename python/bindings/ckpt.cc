// Bindings of lmr::ckpt: checkpoints, the trust manifest, the certifier and recovery
// selection. Enumerations cross as their names ("CANDIDATE", "durable", "sdc").
#include <nanobind/operators.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "lmr/ckpt/certifier.h"
#include "lmr/ckpt/manifest.h"
#include "lmr/ckpt/recovery.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using namespace lmr::ckpt;

std::string str(auto v) { return std::string(name(v)); }

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(ch >= 'a' && ch <= 'z' ? ch - 'a' + 'A' : ch);
  return s;
}

void bindCheckpoint(nb::module_& m) {
  nb::class_<Checkpoint>(m, "CkptCheckpoint", "One captured state in the trust manifest.")
      .def(
          "__init__",
          [](Checkpoint* c, std::string id, std::int64_t step, const std::string& tier, const std::string& state,
             std::string location, std::string topology, std::string reason) {
            new (c) Checkpoint{std::move(id),       step,
                               parseTier(tier),     parseTrustState(state),
                               std::move(location), std::move(topology),
                               std::move(reason),   -1};
          },
          nb::arg("id"), nb::arg("step"), nb::arg("tier"), nb::arg("state"), nb::arg("location") = "",
          nb::arg("topology") = "", nb::arg("reason") = "")
      .def_ro("id", &Checkpoint::id)
      .def_ro("step", &Checkpoint::step)
      .def_prop_ro("tier", [](const Checkpoint& c) { return str(c.tier); })
      .def_prop_ro("state", [](const Checkpoint& c) { return str(c.state); })
      .def_ro("location", &Checkpoint::location)
      .def_ro("topology", &Checkpoint::topology)
      .def_ro("reason", &Checkpoint::reason)
      .def_ro("certified_at", &Checkpoint::certified_at)
      .def("__repr__", [](const Checkpoint& c) {
        return "CkptCheckpoint(" + c.id + ", step " + std::to_string(c.step) + ", " + str(c.state) + ")";
      });
}

void bindDecision(nb::module_& m) {
  nb::class_<RecoveryDecision>(m, "RecoveryDecision",
                               "Which checkpoint to resume from after a failure, and why (lmr::ckpt).")
      .def_ro("mode", &RecoveryDecision::mode)
      .def_ro("source", &RecoveryDecision::source)
      .def_ro("failure", &RecoveryDecision::failure)
      .def_ro("decided_at", &RecoveryDecision::decided_at)
      .def_ro("decided_time", &RecoveryDecision::decided_time)
      .def_ro("step", &RecoveryDecision::step)
      .def_ro("checkpoint_id", &RecoveryDecision::checkpoint_id)
      .def_ro("location", &RecoveryDecision::location)
      .def_ro("tier", &RecoveryDecision::tier)
      .def_ro("topology", &RecoveryDecision::topology)
      .def_ro("available", &RecoveryDecision::available)
      .def_ro("reason", &RecoveryDecision::reason)
      .def_ro("status", &RecoveryDecision::status)
      .def_ro("restart", &RecoveryDecision::restart)
      .def_ro("action", &RecoveryDecision::action)
      .def_ro("blamed_ranks", &RecoveryDecision::blamed_ranks)
      .def_ro("blamed_hosts", &RecoveryDecision::blamed_hosts)
      .def(
          "to_json", [](const RecoveryDecision& d, int indent) { return toJson(d, indent); }, nb::arg("indent") = -1)
      .def_static("from_json", [](const std::string& text) { return parseDecision(text); })
      .def(nb::self == nb::self)
      .def("__repr__", [](const RecoveryDecision& d) { return "RecoveryDecision(" + toJson(d) + ")"; });
}

void bindManifest(nb::module_& m) {
  nb::class_<Manifest>(m, "CkptManifest", "The trust manifest of a job's checkpoints.")
      .def(nb::init<>())
      .def_rw("topology", &Manifest::topology)
      .def_ro("generation", &Manifest::generation)
      .def_ro("tainted_since", &Manifest::tainted_since)
      .def_ro("checkpoints", &Manifest::checkpoints)
      .def_ro("decision", &Manifest::decision)
      .def("find",
           [](const Manifest& mf, const std::string& id) -> std::optional<Checkpoint> {
             const Checkpoint* c = mf.find(id);
             return c ? std::optional<Checkpoint>(*c) : std::nullopt;
           })
      .def("set_decision", [](Manifest& mf, RecoveryDecision d) { mf.setDecision(std::move(d)); })
      .def_ro("history", &Manifest::history, "The decisions before the last one, oldest first.")
      .def(
          "to_json", [](const Manifest& mf, int indent) { return toJson(mf, indent); }, nb::arg("indent") = 2)
      .def_static(
          "from_json", [](const std::string& text, const std::string& source) { return parseManifest(text, source); },
          nb::arg("text"), nb::arg("source") = "manifest")
      .def_static("read",
                  [](const std::string& dir) {
                    nb::gil_scoped_release release;
                    return readManifest(dir);
                  })
      .def("write",
           [](const Manifest& mf, const std::string& dir) {
             nb::gil_scoped_release release;
             writeManifest(dir, mf);
           })
      .def(nb::self == nb::self);
  m.def("ckpt_manifest_path", &manifestPath);
}

void bindCertifier(nb::module_& m) {
  nb::class_<CaptureDecision>(m, "CaptureDecision")
      .def_ro("durable", &CaptureDecision::durable)
      .def_prop_ro("state", [](const CaptureDecision& c) { return str(c.state); })
      .def_ro("latest", &CaptureDecision::latest)
      .def_ro("snapshot", &CaptureDecision::snapshot)
      .def_ro("performance_fault", &CaptureDecision::performance_fault)
      .def_ro("reason", &CaptureDecision::reason);
  nb::class_<Changes>(m, "CertificationChanges")
      .def_ro("capture", &Changes::capture)
      .def_ro("promoted", &Changes::promoted)
      .def_ro("rejected", &Changes::rejected)
      .def_ro("recover", &Changes::recover);
  nb::class_<Certifier>(m, "Certifier", "Checkpoint trust from the job-wide outcome of each check (lmr::ckpt).")
      .def(nb::init<std::vector<std::string>, Manifest, std::int64_t, bool, std::int64_t>(), nb::arg("catalog"),
           nb::arg("manifest"), nb::arg("completed") = 0, nb::arg("dynamic") = false, nb::arg("latest_interval") = 0)
      .def(
          "at_boundary",
          [](const Certifier& c, std::int64_t step, bool checked, bool integrity_sdc_everywhere) {
            return str(c.atBoundary(BoundaryFacts{step, checked, integrity_sdc_everywhere}));
          },
          nb::arg("step"), nb::arg("checked"), nb::arg("integrity_sdc_everywhere") = false,
          "\"skip\", \"capture\" or \"observe\" (lmr::ckpt::BoundaryAction).")
      .def_prop_ro("abandoned", &Certifier::abandoned)
      .def(
          "observe",
          [](Certifier& c, std::int64_t step, const std::string& outcome, std::vector<std::string> accepted,
             std::string reason) {
            return c.observe(CheckOutcome{step, parseOutcome(outcome), std::move(accepted), std::move(reason)});
          },
          nb::arg("step"), nb::arg("outcome"), nb::arg("accepted_recipes"), nb::arg("reason") = "")
      .def("boundary", &Certifier::boundary)
      .def("captured", &Certifier::captured)
      .def("removed", &Certifier::removed)
      .def("snapshots", &Certifier::snapshots)
      .def("recovered", &Certifier::recovered)
      .def("set_decision", &Certifier::setDecision)
      .def_prop_ro("manifest", &Certifier::manifest)
      .def_prop_ro("catalog", &Certifier::catalog)
      .def_prop_ro("covered", &Certifier::covered);
  // The vocabulary Python uses by these names, never by its own literals.
  for (Tier t : {Tier::kDurable, Tier::kLatest}) m.attr(("TIER_" + upper(str(t))).c_str()) = str(t);
  for (TrustState s :
       {TrustState::kLatest, TrustState::kCandidate, TrustState::kRecoveryVerified, TrustState::kRejected})
    m.attr(("TRUST_" + str(s)).c_str()) = str(s);
  nb::list outcomes;
  for (Outcome o : kOutcomes) outcomes.append(str(o));
  m.attr("CKPT_OUTCOMES") = nb::tuple(outcomes);  // by severity
  m.def(
      "ckpt_classify",
      [](std::vector<std::string> sdc_sources, bool sdc_attributed, bool straggler, bool inconclusive,
         std::vector<std::string> checked, std::vector<std::string> inconclusive_recipes,
         std::map<std::string, std::string> reasons, const std::vector<std::string>& catalog) {
        const LocalOutcome o =
            classify(CheckEvidence{std::move(sdc_sources), sdc_attributed, straggler, inconclusive, std::move(checked),
                                   std::move(inconclusive_recipes), std::move(reasons)},
                     catalog);
        return std::make_tuple(str(o.outcome), o.accepted, o.reason);
      },
      nb::arg("sdc_sources"), nb::arg("sdc_attributed"), nb::arg("straggler"), nb::arg("inconclusive"),
      nb::arg("checked"), nb::arg("inconclusive_recipes"), nb::arg("reasons"), nb::arg("catalog"),
      "(outcome, accepted by catalog position, reason) of one rank's check result (lmr::ckpt::classify).");
  m.def(
      "select_recovery",
      [](const Manifest& mf, const std::string& failure, std::int64_t at_step, const std::string& emergency, double now,
         bool durable_only) {
        return selectRecovery(mf, parseFailure(failure), at_step, parseEmergencyReplay(emergency), now, durable_only);
      },
      nb::arg("manifest"), nb::arg("failure"), nb::arg("at_step"), nb::arg("emergency") = "not_run",
      nb::arg("now") = 0.0, nb::arg("durable_only") = false);
  m.def("with_restore_sources", &withRestoreSources, nb::arg("decision"), nb::arg("sources"),
        "The decision with where each rank's fast-tier snapshot came from appended to its reason.");
  m.def("fall_back_to_durable", &fallBackToDurable, nb::arg("manifest"), nb::arg("decision"), nb::arg("why"),
        nb::arg("now") = 0.0,
        "The decision answered from the durable tier when its fast-tier checkpoint could not be restored.");
  m.def(
      "emergency_verdict",
      [](const std::string& worst, const std::vector<bool>& accepted) {
        return str(emergencyVerdict(parseOutcome(worst), accepted));
      },
      nb::arg("worst"), nb::arg("accepted"),
      "\"sdc\", \"clean\" or \"incomplete\" of an emergency replay (lmr::ckpt::emergencyVerdict).");
  m.def(
      "plan_resume",
      [](Manifest& mf, const std::string& topology,
         double now) -> std::optional<std::tuple<RecoveryDecision, bool, bool>> {
        auto plan = planResume(mf, topology, now);
        if (!plan) return std::nullopt;
        return std::make_tuple(plan->decision, plan->undiagnosed, plan->stop);
      },
      nb::arg("manifest"), nb::arg("topology"), nb::arg("now") = 0.0,
      "(decision, undiagnosed, stop) a starting job resumes from, or None (lmr::ckpt::planResume).");
  m.def("release_escalation", &releaseEscalation, nb::arg("manifest"),
        "Turns a pending escalation back into its rollback (in place); False when there is none.");
  m.def("require_topology", &requireTopology, nb::arg("checkpoint"), nb::arg("topology"), nb::arg("reshards") = false,
        "True when `checkpoint` loads resharded here; InvalidArgument when it cannot be loaded "
        "(lmr::ckpt::requireTopology).");
  m.def(
      "match_topology",
      [](const std::string& saved, const std::string& job) {
        switch (matchTopology(saved, job)) {
          case TopologyMatch::kSame: return "same";
          case TopologyMatch::kResharded: return "resharded";
          case TopologyMatch::kOtherModel: break;
        }
        return "other_model";
      },
      nb::arg("saved"), nb::arg("job"), "\"same\", \"resharded\" or \"other_model\" (lmr::ckpt::matchTopology).");
  m.def(
      "apply_recovery", [](Manifest& mf, const std::string& id) { return applyRecovery(mf, id); },
      "Marks the manifest as resumed from checkpoint `id` (in place); returns the abandoned checkpoints.");
}

}  // namespace

void registerCkpt(nb::module_& m) {
  bindCheckpoint(m);
  bindDecision(m);
  bindManifest(m);
  bindCertifier(m);
}

}  // namespace lmr::python
