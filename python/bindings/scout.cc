// Bindings of lmr::mesh and lmr::replay (the decisions behind the SCOUT replay harness).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "lmr/common/error.h"
#include "lmr/common/keyed_hash.h"
#include "lmr/common/sched.h"
#include "lmr/mesh/mesh.h"
#include "lmr/replay/replay.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using DimSpec = std::tuple<std::string, std::int64_t, std::string>;  // (name, size, role)

mesh::Layout layout(const std::vector<DimSpec>& dims, std::int64_t world) {
  std::vector<mesh::Dim> out;
  for (const auto& [name, size, role] : dims) {
    mesh::Role r;
    if (role == "replicate") r = mesh::Role::kReplicate;
    else if (role == "shard") r = mesh::Role::kShard;
    else if (role == "model") r = mesh::Role::kModel;
    else throw InvalidArgument("mesh role must be replicate, shard or model, got '" + role + "'");
    out.push_back(mesh::Dim{name, size, r});
  }
  return mesh::Layout(std::move(out), world);
}

replay::Cadence cadence(std::int64_t check, std::int64_t embedding, std::int64_t hidden, std::int64_t output,
                        std::int64_t optimizer) {
  return replay::Cadence{check, embedding, hidden, output, optimizer};
}

}  // namespace

void registerScout(nb::module_& m) {
  m.def("mesh_peer_groups", [](const std::vector<DimSpec>& dims, std::int64_t world) { return layout(dims, world).peerGroups(); });
  m.def("mesh_compute_groups", [](const std::vector<DimSpec>& dims, std::int64_t world) { return layout(dims, world).computeGroups(); });
  m.def("mesh_needs_materialization",
        [](const std::vector<DimSpec>& dims, std::int64_t world) { return layout(dims, world).needsMaterialization(); });

  m.def(
      "replay_plan",
      [](std::int64_t check, std::int64_t embedding, std::int64_t hidden, std::int64_t output, std::int64_t optimizer,
         std::int64_t step, std::int64_t layers, std::int64_t slices) {
        const replay::Plan p = replay::planAt(cadence(check, embedding, hidden, output, optimizer), step, layers, slices);
        return std::make_tuple(p.embedding, p.hidden_layer, p.output, p.optimizer_slice);
      },
      "(embedding, hidden layer or None, output, optimizer slice or None) due after `step`.");
  m.def("replay_full_plan", [](std::int64_t step, std::int64_t layers, std::int64_t slices) {
    const replay::Plan p = replay::fullPlan(step, layers, slices);
    return std::make_tuple(p.embedding, p.hidden_layer, p.output, p.optimizer_slice);
  });
  m.def("replay_intervals",
        [](std::int64_t check, std::int64_t embedding, std::int64_t hidden, std::int64_t output, std::int64_t optimizer,
           std::int64_t layers) {
          const auto iv = replay::effectiveIntervals(cadence(check, embedding, hidden, output, optimizer), layers);
          return std::make_tuple(iv.embedding, iv.hidden, iv.output, iv.optimizer);
        });
  m.def(
      "replay_seed",
      [](const std::string& recipe, std::int64_t step) {
        return static_cast<std::int64_t>(keyedHash(0, "replay.seed", {recipe}, step) >> 1);
      },
      "The RNG seed every peer uses to replay `recipe` after `step` (from the keyed hash).");
  m.def(
      "thread_times",
      []() -> std::optional<std::pair<std::int64_t, std::int64_t>> {
        const auto t = sched::threadTimes();
        if (!t) return std::nullopt;
        return std::make_pair(t->cpu_ns, t->wait_ns);
      },
      "(CPU ns, run-queue wait ns) of the calling thread, or None where the kernel does not say.");
  m.def(
      "active_ns",
      [](std::int64_t wall, std::pair<std::int64_t, std::int64_t> before, std::pair<std::int64_t, std::int64_t> after) {
        return sched::activeNs(wall, {before.first, before.second}, {after.first, after.second});
      },
      nb::arg("wall_ns"), nb::arg("before"), nb::arg("after"),
      "An interval's time without the scheduler's share: wall - wait, clamped to [CPU time, wall].");
  m.def("replay_is_state_source", [](const std::string& source) { return replay::isStateSource(source); },
        "Whether an evidence surface compares held state (params, state) rather than recomputed values.");
  m.def("contract_digest", [](const std::vector<std::string>& fields) {
    const std::string d = replay::contractDigest(fields);
    return nb::bytes(d.data(), d.size());
  });

  nb::class_<replay::StragglerTracker>(m, "StragglerTracker")
      .def("__init__",
           [](replay::StragglerTracker* t, const consensus::TimingOptions& timing, std::int64_t rounds,
              std::int64_t checks, std::int64_t window) {
             new (t) replay::StragglerTracker(replay::StragglerOptions{timing, rounds, checks, window});
           },
           nb::arg("timing"), nb::arg("confirmation_rounds"), nb::arg("confirmation_checks"), nb::arg("temporal_window"))
      .def("observe",
           [](replay::StragglerTracker& t, const std::string& recipe, std::int64_t step,
              const std::vector<std::vector<double>>& repetitions, const std::vector<std::int64_t>& ranks) {
             auto v = t.observe(recipe, step, repetitions, ranks);
             return std::make_tuple(v.check, v.confirmed, v.outlier_checks);
           },
           nb::arg("recipe"), nb::arg("step"), nb::arg("repetitions"), nb::arg("peer_ranks"),
           "(timing consensus on each peer's fastest repetition, confirmed by position, outlier checks in the window).");
}

}  // namespace lmr::python
