// Bindings of lmr::ckpt's exclusion decisions (include/lmr/ckpt/exclusion.h). Enumerations
// cross as their names ("sdc", "exclude_and_rollback").
#include <nanobind/operators.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "lmr/ckpt/exclusion.h"
#include "lmr/ckpt/manifest.h"

namespace nb = nanobind;

namespace lmr::python {

using namespace lmr::ckpt;

void registerExclusion(nb::module_& m) {
  nb::class_<RecoveryPolicy>(m, "RecoveryPolicy", "When recovery excludes a blamed host (lmr::ckpt).")
      .def(nb::init<>())
      .def_rw("sdc_exclude_after", &RecoveryPolicy::sdc_exclude_after)
      .def_rw("straggler_exclude", &RecoveryPolicy::straggler_exclude)
      .def_rw("straggler_exclude_after", &RecoveryPolicy::straggler_exclude_after)
      .def_rw("health_fatal_exclude", &RecoveryPolicy::health_fatal_exclude)
      .def_rw("hang_exclude_after", &RecoveryPolicy::hang_exclude_after)
      .def_rw("max_excluded", &RecoveryPolicy::max_excluded)
      .def_rw("min_nodes", &RecoveryPolicy::min_nodes)
      .def_rw("max_identical", &RecoveryPolicy::max_identical)
      .def_rw("in_process", &RecoveryPolicy::in_process)
      .def_rw("hang_relaunch", &RecoveryPolicy::hang_relaunch)
      .def_static(
          "from_json", [](const std::string& text, const std::string& source) { return parsePolicy(text, source); },
          nb::arg("text"), nb::arg("source") = "policy")
      .def(
          "to_json", [](const RecoveryPolicy& p, int indent) { return toJson(p, indent); }, nb::arg("indent") = 2)
      .def(nb::self == nb::self);

  nb::class_<ExclusionDecision>(m, "ExclusionDecision", "What recovery does about who a failure blames.")
      .def_prop_ro("action", [](const ExclusionDecision& d) { return std::string(name(d.action)); })
      .def_prop_ro("kind", [](const ExclusionDecision& d) { return std::string(name(d.kind)); })
      .def_ro("hosts", &ExclusionDecision::hosts)
      .def_ro("exclude", &ExclusionDecision::exclude)
      .def_ro("occurrence", &ExclusionDecision::occurrence)
      .def_ro("reason", &ExclusionDecision::reason);

  nb::class_<ExclusionLedger>(m, "ExclusionLedger", "lmr-exclusions.json: every blame decided on, every host excluded.")
      .def(nb::init<>())
      .def_prop_ro("excluded_hosts",
                   [](const ExclusionLedger& l) {
                     std::vector<std::string> out;
                     for (const auto& e : l.excluded) out.push_back(e.host);
                     return out;
                   })
      .def_ro("decisions", &ExclusionLedger::decisions)
      .def("is_excluded", [](const ExclusionLedger& l, const std::string& host) { return l.isExcluded(host); })
      .def(
          "to_json", [](const ExclusionLedger& l, int indent) { return toJson(l, indent); }, nb::arg("indent") = 2)
      .def_static(
          "from_json", [](const std::string& text, const std::string& source) { return parseLedger(text, source); },
          nb::arg("text"), nb::arg("source") = "ledger")
      .def_static("read",
                  [](const std::string& dir) {
                    nb::gil_scoped_release release;
                    return readLedger(dir);
                  })
      .def("write",
           [](const ExclusionLedger& l, const std::string& dir) {
             nb::gil_scoped_release release;
             writeLedger(dir, l);
           })
      .def(nb::self == nb::self);
  m.def("exclusion_ledger_path", &ledgerPath);
  m.def(
      "respond_to",
      [](const ExclusionDecision& e, bool fatal) {
        const CulpritResponse r = respondTo(e, fatal);
        return std::make_tuple(std::string(name(r.failure)), r.leave);
      },
      nb::arg("exclusion"), nb::arg("fatal") = false,
      "(failure, leave) a culprit's exclusion decision leads to (lmr::ckpt::respondTo).");
  m.def("rolls_back_in_process", &rollsBackInProcess, nb::arg("decision"), nb::arg("policy"),
        "Whether the decision is carried out in the running processes (lmr::ckpt::rollsBackInProcess).");
  m.def(
      "ends_hang", [](const std::string& kind, const RecoveryPolicy& policy) { return endsHang(kind, policy); },
      nb::arg("kind"), nb::arg("policy"),
      "Whether an out-of-band report of `kind` ends the job now, for the relaunch (lmr::ckpt::endsHang).");
  m.def(
      "readmit", [](ExclusionLedger& ledger, const std::string& host) { return readmit(ledger, host); },
      nb::arg("ledger"), nb::arg("host"),
      "Takes a repaired host off the excluded list (in place; lmr::ckpt::readmit); False when it was not on it.");
  m.def(
      "apply_exclusion",
      [](RecoveryDecision decision, const ExclusionDecision& exclusion, std::vector<std::int64_t> ranks,
         const Manifest& manifest, bool fast_tier_survives) {
        applyExclusion(decision, exclusion, Blame{exclusion.kind, std::move(ranks), exclusion.hosts, {}, 0, 0},
                       manifest, fast_tier_survives);
        return decision;
      },
      nb::arg("decision"), nb::arg("exclusion"), nb::arg("ranks"), nb::arg("manifest"),
      nb::arg("fast_tier_survives") = false,
      "The RecoveryDecision that carries `exclusion` out (lmr::ckpt::applyExclusion); a new object.");

  m.def(
      "decide_exclusion",
      [](const RecoveryPolicy& policy, ExclusionLedger& ledger, const std::string& kind,
         std::vector<std::int64_t> ranks, std::vector<std::string> hosts, std::vector<std::string> sources,
         std::int64_t step, std::int64_t generation, std::int64_t nodes, bool confirmed, bool fatal) {
        const Blame blame{parseBlameKind(kind),
                          std::move(ranks),
                          std::move(hosts),
                          std::move(sources),
                          step,
                          generation,
                          confirmed,
                          fatal};
        return decideExclusion(policy, ledger, blame, nodes);
      },
      nb::arg("policy"), nb::arg("ledger"), nb::arg("kind"), nb::arg("ranks"), nb::arg("hosts"), nb::arg("sources"),
      nb::arg("step"), nb::arg("generation"), nb::arg("nodes"), nb::arg("confirmed") = true, nb::arg("fatal") = false,
      "lmr::ckpt::decideExclusion: decides and records the blame in `ledger` (in place).");
}

}  // namespace lmr::python
