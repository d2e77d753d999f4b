// Bindings of lmr::inject: corruption of a tensor's host bytes (a flat, writable uint8
// view the caller owns) and its retirement.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "lmr/campaign/session.h"
#include "lmr/common/error.h"
#include "lmr/common/json.h"
#include "lmr/inject/corrupt.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using namespace lmr::inject;

using HostBytes = nb::ndarray<std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

Int128 seedFrom(const std::string& text) {
  auto s = json::parseInt128(text);
  if (!s) throw InvalidArgument("seed \"" + text + "\" is not a 128-bit integer");
  return *s;
}

std::int64_t elementCount(const HostBytes& bytes, Dtype d) {
  if (bytes.size() % dtypeSize(d) != 0) throw InvalidArgument("byte count is not a multiple of the dtype size");
  return static_cast<std::int64_t>(bytes.size() / dtypeSize(d));
}

}  // namespace

void registerInject(nb::module_& m) {
  nb::class_<Applied>(m, "AppliedCorruption")
      .def_ro("changed", &Applied::changed)
      .def_prop_ro("count", [](const Applied& a) { return a.indices.size(); })
      .def_ro("indices", &Applied::indices);

  nb::class_<campaign::EffectSpec>(m, "EffectSpec")
      .def_prop_ro("type", [](const campaign::EffectSpec& e) { return std::string(campaign::name(e.type)); })
      .def_prop_ro("surface", [](const campaign::EffectSpec& e) { return std::string(campaign::name(e.surface)); })
      .def_ro("delay_ms", &campaign::EffectSpec::delay_ms)
      .def_ro("parameter", &campaign::EffectSpec::parameter)
      .def_ro("state_key", &campaign::EffectSpec::state_key);
  m.def(
      "effect_spec",
      [](const campaign::Campaign& c, std::size_t incident, std::size_t fault) {
        return campaign::effectSpec(c.incidents().at(incident).faults.at(fault));
      },
      nb::arg("campaign"), nb::arg("incident"), nb::arg("fault"),
      "The built-in effect of a fault, with every parameter default applied.");
  m.def(
      "corrupt",
      [](HostBytes bytes, const std::string& dtype, std::int64_t rows, const std::string& seed,
         const std::string& injection_id, const campaign::EffectSpec& spec) {
        const Dtype d = parseDtype(dtype);
        const std::int64_t numel = elementCount(bytes, d);
        const Selection selection(seedFrom(seed), injection_id, spec.scope, numel, rows);
        nb::gil_scoped_release release;
        return corrupt(bytes.data(), d, numel, selection, spec.corruption);
      },
      nb::arg("bytes"), nb::arg("dtype"), nb::arg("rows"), nb::arg("seed"), nb::arg("injection_id"), nb::arg("spec"),
      "Corrupts the selected elements of a host buffer in place; returns what retire() needs.");
  m.def(
      "effect_indices",
      [](const std::string& seed, const std::string& injection_id, const campaign::EffectSpec& spec, std::int64_t numel,
         std::int64_t rows) { return Selection(seedFrom(seed), injection_id, spec.scope, numel, rows).indices(); },
      nb::arg("seed"), nb::arg("injection_id"), nb::arg("spec"), nb::arg("numel"), nb::arg("rows"),
      "The element indices an effect selects.");
  m.def(
      "reorder_rows",
      [](HostBytes bytes, std::int64_t rows) {
        if (rows <= 0 || bytes.size() % static_cast<std::size_t>(rows) != 0)
          throw InvalidArgument("reorder: the byte count is not a multiple of the row count");
        nb::gil_scoped_release release;
        return reorderRows(bytes.data(), rows, bytes.size() / static_cast<std::size_t>(rows));
      },
      nb::arg("bytes"), nb::arg("rows"), "Rotates the rows of a host buffer by one in place; returns rows changed.");
  m.def(
      "overwrite",
      [](HostBytes bytes, const std::string& dtype, const std::vector<std::int64_t>& indices, HostBytes values) {
        const Dtype d = parseDtype(dtype);
        const std::int64_t numel = elementCount(bytes, d);
        if (elementCount(values, d) != static_cast<std::int64_t>(indices.size())) {
          throw InvalidArgument("overwrite: one value per index is needed");
        }
        nb::gil_scoped_release release;
        return overwrite(bytes.data(), d, numel, indices, values.data());
      },
      nb::arg("bytes"), nb::arg("dtype"), nb::arg("indices"), nb::arg("values"),
      "Writes `values` over the elements `indices` in place (stale or duplicated data).");
  m.def(
      "retire",
      [](HostBytes bytes, const std::string& dtype, const Applied& applied) {
        const Dtype d = parseDtype(dtype);
        const std::int64_t numel = elementCount(bytes, d);
        nb::gil_scoped_release release;
        return retire(bytes.data(), d, numel, applied);
      },
      nb::arg("bytes"), nb::arg("dtype"), nb::arg("applied"),
      "Undoes a corruption: exact restore where untouched since, delta subtraction elsewhere.");
  m.def(
      "selection_indices",
      [](const std::string& seed, const std::string& injection_id, const std::string& scope, std::int64_t numel,
         std::int64_t rows) {
        return Selection(seedFrom(seed), injection_id, parseScope(scope), numel, rows).indices();
      },
      "The element indices an injection selects (for checks and history windows).");
  m.def("flipped_bits", [](const std::string& dtype, const std::string& operation, const std::string& magnitude) {
    return flippedBits(parseDtype(dtype), parseOperation(operation), parseMagnitude(magnitude));
  });
}

}  // namespace lmr::python
