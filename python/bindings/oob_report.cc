// Bindings of the SCOUTFaultReport (lmr::oob::ScoutFaultReport): the class, its strict
// reader and writer, and the report kinds with the fault-injection kit kind of each.
#include <nanobind/operators.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <filesystem>

#include "bindings.h"
#include "lmr/common/error.h"
#include "lmr/common/files.h"
#include "lmr/common/json.h"
#include "lmr/oob/report.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using oob::ScoutFaultReport;
using Ranks = std::vector<std::int64_t>;

nb::object jsonModule() { return nb::module_::import_("json"); }
nlohmann::json toJsonValue(nb::handle value, const char* what) {
  return json::parse(nb::cast<std::string>(jsonModule().attr("dumps")(value)), what).value;
}
nb::object fromJsonValue(const nlohmann::json& value) { return jsonModule().attr("loads")(value.dump()); }

template <typename T>
nb::tuple tupleOf(const std::vector<T>& values) {
  nb::list out;
  for (const T& v : values) out.append(v);
  return nb::tuple(out);
}

std::optional<std::string_view> kitKind(const std::string& kind) {
  for (const oob::ReportKind& k : oob::reportKinds())
    if (kind == k.name) return k.kit_kind;
  return std::nullopt;
}

}  // namespace

void registerOobReport(nb::module_& m) {
  nb::dict kinds;
  for (const oob::ReportKind& k : oob::reportKinds())
    kinds[k.name] = k.kit_kind ? nb::object(nb::str(k.kit_kind->data(), k.kit_kind->size())) : nb::none();
  m.attr("SCOUT_REPORT_KINDS") = kinds;

  nb::class_<ScoutFaultReport>(m, "SCOUTFaultReport",
                               "What the out-of-band path concluded about one stall (lmr::oob::ScoutFaultReport).")
      .def(
          "__init__",
          [](ScoutFaultReport* self, std::string kind, std::string scope, Ranks ranks, std::vector<std::string> hosts,
             Ranks missing_ranks, nb::handle evidence, std::optional<double> detection_latency_s,
             std::int64_t generation, std::string run_id, std::string report_id, std::optional<std::int64_t> step,
             std::optional<std::int64_t> round, std::optional<double> threshold_s, std::string peer_group,
             Ranks group_ranks, std::optional<std::int64_t> written_by) {
            ScoutFaultReport r{std::move(kind),
                               std::move(scope),
                               std::move(ranks),
                               std::move(hosts),
                               std::move(missing_ranks),
                               toJsonValue(evidence, "evidence"),
                               detection_latency_s,
                               generation,
                               std::move(run_id),
                               std::move(report_id),
                               step,
                               round,
                               threshold_s,
                               std::move(peer_group),
                               std::move(group_ranks),
                               written_by};
            oob::validate(r);
            new (self) ScoutFaultReport(std::move(r));
          },
          nb::arg("kind"), nb::arg("scope"), nb::arg("ranks"), nb::arg("hosts"), nb::arg("missing_ranks") = Ranks{},
          nb::arg("evidence").none() = nb::none(), nb::arg("detection_latency_s").none() = nb::none(),
          nb::arg("generation") = 0, nb::arg("run_id") = "", nb::arg("report_id") = "",
          nb::arg("step").none() = nb::none(), nb::arg("round").none() = nb::none(),
          nb::arg("threshold_s").none() = nb::none(), nb::arg("peer_group") = "", nb::arg("group_ranks") = Ranks{},
          nb::arg("written_by").none() = nb::none())
      .def_ro("kind", &ScoutFaultReport::kind)
      .def_ro("scope", &ScoutFaultReport::scope)
      .def_prop_ro("ranks", [](const ScoutFaultReport& r) { return tupleOf(r.ranks); })
      .def_prop_ro("hosts", [](const ScoutFaultReport& r) { return tupleOf(r.hosts); })
      .def_prop_ro("missing_ranks", [](const ScoutFaultReport& r) { return tupleOf(r.missing_ranks); })
      .def_prop_ro("evidence", [](const ScoutFaultReport& r) { return fromJsonValue(r.evidence); })
      .def_ro("detection_latency_s", &ScoutFaultReport::detection_latency_s)
      .def_ro("generation", &ScoutFaultReport::generation)
      .def_ro("run_id", &ScoutFaultReport::run_id)
      .def_ro("report_id", &ScoutFaultReport::report_id)
      .def_ro("step", &ScoutFaultReport::step)
      .def_ro("round", &ScoutFaultReport::round)
      .def_ro("threshold_s", &ScoutFaultReport::threshold_s)
      .def_ro("peer_group", &ScoutFaultReport::peer_group)
      .def_prop_ro("group_ranks", [](const ScoutFaultReport& r) { return tupleOf(r.group_ranks); })
      .def_ro("written_by", &ScoutFaultReport::written_by)
      .def_prop_ro("_kit_kind", [](const ScoutFaultReport& r) { return kitKind(r.kind); })
      .def_static(
          "from_dict", [](nb::handle data) { return oob::parseReport(toJsonValue(data, "SCOUTFaultReport")); },
          nb::arg("data"), "Strict: raises InvalidArgumentError naming the JSON path of what is wrong.")
      .def_static(
          "from_file",
          [](const std::filesystem::path& path) {
            const std::string name = path.string();
            std::optional<std::string> text;
            {
              nb::gil_scoped_release release;
              text = files::readFile(name);
            }
            if (!text) throw IoError("cannot read " + name + ": no such file");
            return oob::parseReport(*text, name);
          },
          nb::arg("path"))
      .def("to_dict", [](const ScoutFaultReport& r) { return fromJsonValue(oob::toJson(r)); })
      .def(
          "to_json", [](const ScoutFaultReport& r, int indent) { return oob::toJson(r).dump(indent); },
          nb::arg("indent") = -1)
      .def(nb::self == nb::self)
      .def("__hash__", [](const ScoutFaultReport& r) { return nb::hash(nb::str(oob::toJson(r).dump().c_str())); })
      .def("__repr__", [](const ScoutFaultReport& r) { return "SCOUTFaultReport(" + oob::toJson(r).dump() + ")"; });
}

}  // namespace lmr::python
