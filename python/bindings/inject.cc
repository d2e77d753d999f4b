// Bindings of lmr::inject: corruption of a tensor's host bytes (a flat, writable uint8
// view the caller owns) and its retirement.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
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

  m.def(
      "corrupt",
      [](HostBytes bytes, const std::string& dtype, std::int64_t rows, const std::string& seed, const std::string& injection_id,
         const std::string& scope, const std::string& operation, const std::string& magnitude, std::optional<double> value,
         std::optional<double> factor, std::optional<double> stddev) {
        const Dtype d = parseDtype(dtype);
        const std::int64_t numel = elementCount(bytes, d);
        const Selection selection(seedFrom(seed), injection_id, parseScope(scope), numel, rows);
        Spec spec;
        spec.operation = parseOperation(operation);
        spec.magnitude = parseMagnitude(magnitude);
        spec.value = value;
        spec.factor = factor;
        spec.stddev = stddev;
        nb::gil_scoped_release release;
        return corrupt(bytes.data(), d, numel, selection, spec);
      },
      nb::arg("bytes"), nb::arg("dtype"), nb::arg("rows"), nb::arg("seed"), nb::arg("injection_id"), nb::arg("scope"),
      nb::arg("operation"), nb::arg("magnitude"), nb::arg("value").none() = nb::none(), nb::arg("factor").none() = nb::none(),
      nb::arg("stddev").none() = nb::none(),
      "Corrupts the selected elements of a host buffer in place; returns what retire() needs.");
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
        elementCount(bytes, d);
        nb::gil_scoped_release release;
        return retire(bytes.data(), d, applied);
      },
      nb::arg("bytes"), nb::arg("dtype"), nb::arg("applied"),
      "Undoes a corruption: exact restore where untouched since, delta subtraction elsewhere.");
  m.def(
      "selection_indices",
      [](const std::string& seed, const std::string& injection_id, const std::string& scope, std::int64_t numel, std::int64_t rows) {
        return Selection(seedFrom(seed), injection_id, parseScope(scope), numel, rows).indices();
      },
      "The element indices an injection selects (for checks and history windows).");
  m.def("flipped_bits", [](const std::string& dtype, const std::string& operation, const std::string& magnitude) {
    return flippedBits(parseDtype(dtype), parseOperation(operation), parseMagnitude(magnitude));
  });
}

}  // namespace lmr::python
