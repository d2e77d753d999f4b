// Bindings of lmr::moe's execution-regime catalog (include/lmr/moe/catalog.h).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <limits>

#include "bindings.h"
#include "lmr/moe/alltoall.h"
#include "lmr/moe/catalog.h"

namespace nb = nanobind;

namespace lmr::python {

namespace {

// A shape as Python holds it: (fingerprint, path counts).
using ShapeSpec = std::pair<std::string, std::vector<std::int64_t>>;

moe::Shape toShape(const ShapeSpec& s) { return {s.first, s.second}; }
ShapeSpec fromShape(const moe::Shape& s) { return {s.fingerprint, s.paths}; }

std::vector<ShapeSpec> fromShapes(const std::vector<moe::Shape>& shapes) {
  std::vector<ShapeSpec> out;
  out.reserve(shapes.size());
  for (const auto& s : shapes) out.push_back(fromShape(s));
  return out;
}

}  // namespace

void registerMoe(nb::module_& m) {
  nb::class_<moe::Catalog>(m, "MoeCatalog",
                           "Admitted expert-kernel shapes and the non-dominated representatives covering them "
                           "(lmr::moe::Catalog).")
      .def(nb::init<std::size_t>(), nb::arg("remember") = std::numeric_limits<std::size_t>::max(),
           "remember: distinct shapes kept for deduplication and coverage validation (beyond it a repeat of a "
           "shape not kept counts again).")
      .def(
          "admit",
          [](moe::Catalog& c, const std::string& fingerprint, std::vector<std::int64_t> paths) {
            return c.admit({fingerprint, std::move(paths)});
          },
          nb::arg("fingerprint"), nb::arg("paths"), "True when the shape is new; InvalidArgumentError for bad counts.")
      .def(
          "admit_many",
          [](moe::Catalog& c, const std::vector<ShapeSpec>& shapes) {
            std::size_t fresh = 0;
            for (const auto& s : shapes) fresh += c.admit(toShape(s)) ? 1 : 0;
            return fresh;
          },
          nb::arg("shapes"), "Admits (fingerprint, paths) pairs in order; returns how many were new.")
      .def_prop_ro("admitted", &moe::Catalog::admitted)
      .def_prop_ro("remembered", &moe::Catalog::remembered)
      .def("representatives", [](const moe::Catalog& c) { return fromShapes(c.representatives()); })
      .def_prop_ro("compression", &moe::Catalog::compression)
      .def(
          "uncovered",
          [](const moe::Catalog& c) -> std::optional<ShapeSpec> {
            auto s = c.uncovered();
            if (!s) return std::nullopt;
            return fromShape(*s);
          },
          "The first admitted shape no representative covers, or None.")
      .def("memory_bytes", &moe::Catalog::memoryBytes)
      .def(
          "window",
          [](const moe::Catalog& c, std::int64_t check, std::int64_t per_check) {
            return fromShapes(c.window(check, per_check));
          },
          nb::arg("check"), nb::arg("per_check"),
          "The representatives the check-th replay takes: per fingerprint, a rotating window of per_check.")
      .def(
          "replayed",
          [](moe::Catalog& c, const std::vector<ShapeSpec>& shapes) {
            std::vector<moe::Shape> in;
            for (const auto& s : shapes) in.push_back(toShape(s));
            c.replayed(in);
          },
          nb::arg("shapes"), "Shapes an accepted check replayed.")
      .def("cycle_complete", &moe::Catalog::cycleComplete,
           "Whether every current representative was replayed since the cycle began.")
      .def("start_cycle", &moe::Catalog::startCycle);

  m.def(
      "moe_skyline",
      [](const std::vector<ShapeSpec>& shapes) {
        std::vector<moe::Shape> in;
        in.reserve(shapes.size());
        for (const auto& s : shapes) in.push_back(toShape(s));
        return fromShapes(moe::skyline(std::move(in)));
      },
      nb::arg("shapes"), "The exact smallest covering set of (fingerprint, paths) shapes, sorted.");
  m.def(
      "moe_covers", [](const ShapeSpec& a, const ShapeSpec& b) { return moe::covers(toShape(a), toShape(b)); },
      nb::arg("a"), nb::arg("b"));
  m.def(
      "moe_regime_tokens",
      [](const std::vector<std::int64_t>& counts, std::int64_t granularity) {
        std::vector<std::int64_t> out;
        out.reserve(counts.size());
        for (std::int64_t c : counts) out.push_back(moe::regimeTokens(c, granularity));
        return out;
      },
      nb::arg("counts"), nb::arg("granularity"),
      "Each token count's execution regime (lmr::moe::regimeTokens): rounded up by at most a quarter.");
  m.def("moe_default_matrices", &moe::defaultMatrices, nb::arg("ranks"), nb::arg("rows"),
        nb::arg("max_shifts") = moe::kDefaultShifts,
        "The default bounded AllToAll replay policy: the balanced matrix, then up to max_shifts cyclic "
        "permutations spread over the group.");
  m.def(
      "moe_validate_matrix",
      [](const moe::Matrix& matrix, std::int64_t ranks, const std::string& what) {
        moe::validateMatrix(matrix, ranks, what);
      },
      nb::arg("matrix"), nb::arg("ranks"), nb::arg("what") = "matrix",
      "InvalidArgumentError naming the entry unless `matrix` is ranks x ranks, non-negative, not all zero.");
  m.def("moe_routing_vote", &moe::routingVote, nb::arg("matrices"), nb::arg("me"), nb::arg("bad"),
        "A receiver's routing vote: per matrix and sender, '-' no segment, '0' intact, '1' corrupted.");
  m.def(
      "moe_decide_routing",
      [](const std::vector<std::string>& votes) {
        const moe::RoutingVerdict v = moe::decideRouting(votes);
        return std::make_tuple(v.status, v.bitmap, v.reason);
      },
      nb::arg("votes"), "(status, blamed by expert-parallel position, reason) from each receiver's routing vote.");
  m.def("moe_rotation", &moe::rotation, nb::arg("check"), nb::arg("count"), nb::arg("per_check"),
        "The representative indices the check-th check replays.");
}

}  // namespace lmr::python
