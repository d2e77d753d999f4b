// Bindings of lmr::mesh and lmr::replay (the decisions behind the SCOUT replay harness).
#include <nanobind/stl/map.h>
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
#include "lmr/replay/verdict.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using DimSpec = std::tuple<std::string, std::int64_t, std::string>;  // (name, size, role)

// A peer's final vote as Python holds it: ({surface: fingerprint bytes}, {recipe: seconds},
// {recipe: error text}).
using VoteSpec = std::tuple<std::map<std::string, nb::bytes>, std::map<std::string, std::vector<double>>,
                            std::map<std::string, std::string>>;

using Groups = std::vector<std::vector<std::int64_t>>;

replay::PeerLayout peerLayout(const std::vector<std::int64_t>& ranks, const Groups& state_groups,
                              const Groups& expert_groups = {}, const Groups& ep_groups = {}) {
  return replay::PeerLayout{ranks, state_groups, expert_groups, ep_groups};
}

mesh::Layout layout(const std::vector<DimSpec>& dims, std::int64_t world) {
  std::vector<mesh::Dim> out;
  for (const auto& [name, size, role] : dims) {
    mesh::Role r;
    if (role == "replicate") r = mesh::Role::kReplicate;
    else if (role == "shard") r = mesh::Role::kShard;
    else if (role == "model") r = mesh::Role::kModel;
    else if (role == "expert") r = mesh::Role::kExpert;
    else throw InvalidArgument("mesh role must be replicate, shard, model or expert, got '" + role + "'");
    out.push_back(mesh::Dim{name, size, r});
  }
  return mesh::Layout(std::move(out), world);
}

// (check, embedding, hidden, output, optimizer, moe) intervals, as ReplayHarnessConfig.cadence() gives them.
using CadenceSpec =
    std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

replay::Cadence cadence(const CadenceSpec& c) {
  const auto& [check, embedding, hidden, output, optimizer, moe, coverage] = c;
  return replay::Cadence{check, embedding, hidden, output, optimizer, moe, coverage};
}

auto planTuple(const replay::Plan& p) {
  return std::make_tuple(p.embedding, p.hidden_layer, p.output, p.optimizer_slice, p.moe_layer);
}

}  // namespace

void registerScout(nb::module_& m) {
  m.def("mesh_peer_groups",
        [](const std::vector<DimSpec>& dims, std::int64_t world) { return layout(dims, world).peerGroups(); });
  m.def("mesh_compute_groups",
        [](const std::vector<DimSpec>& dims, std::int64_t world) { return layout(dims, world).computeGroups(); });
  m.def("mesh_expert_groups",
        [](const std::vector<DimSpec>& dims, std::int64_t world) { return layout(dims, world).expertGroups(); });
  m.def("mesh_expert_parallel_groups", [](const std::vector<DimSpec>& dims, std::int64_t world) {
    return layout(dims, world).expertParallelGroups();
  });
  m.def("mesh_has_experts",
        [](const std::vector<DimSpec>& dims, std::int64_t world) { return layout(dims, world).hasExperts(); });
  m.def("mesh_needs_materialization", [](const std::vector<DimSpec>& dims, std::int64_t world) {
    return layout(dims, world).needsMaterialization();
  });

  m.def(
      "replay_plan",
      [](const CadenceSpec& c, std::int64_t step, std::int64_t layers, std::int64_t slices, std::int64_t moe_layers,
         bool modules, bool optimizer) {
        return planTuple(replay::planAt(cadence(c), step, layers, slices, moe_layers, {modules, optimizer}));
      },
      nb::arg("cadence"), nb::arg("step"), nb::arg("layers"), nb::arg("slices"), nb::arg("moe_layers") = 0,
      nb::arg("modules") = true, nb::arg("optimizer") = true,
      "(embedding, hidden layer or None, output, optimizer slice or None, MoE layer position or None) due after "
      "`step`.");
  m.def(
      "replay_full_plan",
      [](std::int64_t step, std::int64_t layers, std::int64_t slices, std::int64_t moe_layers, bool modules,
         bool optimizer) {
        return planTuple(replay::fullPlan(step, layers, slices, moe_layers, {modules, optimizer}));
      },
      nb::arg("step"), nb::arg("layers"), nb::arg("slices"), nb::arg("moe_layers") = 0, nb::arg("modules") = true,
      nb::arg("optimizer") = true);
  std::vector<std::string> classes(replay::kRecipeClasses.begin(), replay::kRecipeClasses.end());
  m.attr("REPLAY_RECIPE_CLASSES") = nb::tuple(nb::cast(classes));  // a check's layout order
  m.def(
      "replay_catalog",
      [](const CadenceSpec& c, const std::vector<std::int64_t>& layer_ids, std::int64_t slices,
         const std::vector<std::int64_t>& moe_layer_ids) {
        return replay::catalog(cadence(c), layer_ids, slices, moe_layer_ids);
      },
      nb::arg("cadence"), nb::arg("layer_ids"), nb::arg("slices"),
      nb::arg("moe_layer_ids") = std::vector<std::int64_t>{},
      "The recipe ids a complete cycle covers (lmr::replay::catalog).");
  m.def(
      "replay_intervals",
      [](const CadenceSpec& c, std::int64_t layers, std::int64_t moe_layers) {
        const auto iv = replay::effectiveIntervals(cadence(c), layers, moe_layers);
        return std::make_tuple(iv.embedding, iv.hidden, iv.output, iv.optimizer, iv.moe);
      },
      nb::arg("cadence"), nb::arg("layers"), nb::arg("moe_layers") = 0);
  m.def(
      "replay_worst_latency",
      [](const CadenceSpec& c, std::int64_t layers, std::int64_t slices, std::int64_t moe_layers, bool pipelined) {
        const auto l = replay::worstCaseLatency(cadence(c), layers, slices, moe_layers, pipelined);
        return std::map<std::string, std::int64_t>{
            {"embedding", l.embedding}, {"hidden", l.hidden}, {"output", l.output},
            {"optimizer", l.optimizer}, {"moe", l.moe},       {"modules", l.modules}};
      },
      nb::arg("cadence"), nb::arg("layers"), nb::arg("slices"), nb::arg("moe_layers") = 0, nb::arg("pipelined") = true,
      "Worst-case detection latency in steps by recipe class, and for every module (lmr::replay::worstCaseLatency).");
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
  m.def(
      "replay_is_state_source", [](const std::string& source) { return replay::isStateSource(source); },
      "Whether an evidence surface compares held state (params, state) rather than recomputed values.");
  m.def("contract_digest", [](const std::vector<std::string>& fields) {
    const std::string d = replay::contractDigest(fields);
    return nb::bytes(d.data(), d.size());
  });

  nb::class_<replay::SurfaceVerdict>(m, "SurfaceVerdict")
      .def_ro("status", &replay::SurfaceVerdict::status)
      .def_ro("bitmap", &replay::SurfaceVerdict::bitmap)
      .def_prop_ro("evidence",
                   [](const replay::SurfaceVerdict& v) {
                     std::vector<nb::bytes> out;
                     for (const std::string& e : v.evidence) out.push_back(asBytes(e));
                     return out;
                   })
      .def_ro("split", &replay::SurfaceVerdict::split);
  nb::class_<replay::CheckVerdict>(m, "CheckVerdict")
      .def_ro("status", &replay::CheckVerdict::status)
      .def_ro("sdc_bitmap", &replay::CheckVerdict::sdc_bitmap)
      .def_ro("sdc_sources", &replay::CheckVerdict::sdc_sources)
      .def_ro("surfaces", &replay::CheckVerdict::surfaces)
      .def_ro("inconclusive", &replay::CheckVerdict::inconclusive)
      .def_ro("reasons", &replay::CheckVerdict::reasons)
      .def_ro("straggler_bitmap", &replay::CheckVerdict::straggler_bitmap)
      .def_ro("straggler_candidates", &replay::CheckVerdict::straggler_candidates);
  m.def(
      "replay_readiness",
      [](const std::vector<std::int64_t>& ranks, const Groups& state_groups, const std::vector<std::string>& recipes,
         const std::vector<std::pair<std::map<std::string, nb::bytes>, std::map<std::string, std::string>>>& votes) {
        std::vector<replay::ReadinessVote> in;
        for (const auto& [contracts, reasons] : votes) {
          replay::ReadinessVote v;
          for (const auto& [k, b] : contracts) v.contracts[k] = std::string(b.c_str(), b.size());
          v.reasons = reasons;
          in.push_back(std::move(v));
        }
        const replay::Readiness r = replay::decideReadiness(peerLayout(ranks, state_groups), recipes, in);
        return std::make_pair(r.ready, r.reasons);
      },
      nb::arg("ranks"), nb::arg("state_groups"), nb::arg("recipes"), nb::arg("votes"),
      "(ready by recipe, {recipe: reason}) from every peer's ({recipe: contract}, {recipe: reason}).");
  m.def(
      "replay_decide_check",
      [](const std::vector<std::int64_t>& ranks, const Groups& state_groups, std::int64_t step,
         const std::vector<std::string>& checked, const std::vector<std::pair<std::string, std::string>>& not_ready,
         const std::vector<VoteSpec>& votes, replay::StragglerTracker& tracker, const Groups& expert_groups,
         const Groups& ep_groups) {
        std::vector<replay::CheckVote> in;
        for (const auto& [surfaces, repetitions, errors] : votes) {
          replay::CheckVote v;
          for (const auto& [k, b] : surfaces) v.surfaces[k] = std::string(b.c_str(), b.size());
          v.repetitions = repetitions;
          v.errors = errors;
          in.push_back(std::move(v));
        }
        return replay::decideCheck(peerLayout(ranks, state_groups, expert_groups, ep_groups), step, checked, not_ready,
                                   in, tracker);
      },
      nb::arg("ranks"), nb::arg("state_groups"), nb::arg("step"), nb::arg("checked"), nb::arg("not_ready"),
      nb::arg("votes"), nb::arg("tracker"), nb::arg("expert_groups") = Groups{}, nb::arg("ep_groups") = Groups{},
      "The verdict of a check from every peer's vote (lmr::replay::decideCheck).");
  m.def("replay_source_rank", [](const std::vector<std::int64_t>& ranks, std::int64_t step) {
    return replay::sourceRank(replay::PeerLayout{ranks, {}}, step);
  });

  nb::class_<replay::StragglerOptions>(m, "StragglerOptions")
      .def(nb::init<>())
      .def_rw("timing", &replay::StragglerOptions::timing)
      .def_rw("confirmation_rounds", &replay::StragglerOptions::confirmation_rounds)
      .def_rw("confirmation_checks", &replay::StragglerOptions::confirmation_checks)
      .def_rw("temporal_window", &replay::StragglerOptions::temporal_window);
  m.def("straggler_defaults", &replay::stragglerDefaults, nb::arg("host_clock"),
        "lmr::replay::stragglerDefaults: the straggler options for a host (CPU) or device clock.");
  nb::class_<replay::CheckDefaults>(m, "CheckDefaults",
                                    "lmr::replay::CheckDefaults: a check's defaults on a host or device clock.")
      .def_ro("straggler", &replay::CheckDefaults::straggler)
      .def_ro("pipelined", &replay::CheckDefaults::pipelined)
      .def_ro("timing_repeats", &replay::CheckDefaults::timing_repeats)
      .def_ro("state_integrity", &replay::CheckDefaults::state_integrity)
      .def_ro("comm_absolute_s", &replay::CheckDefaults::comm_absolute_s);
  m.def("check_defaults", &replay::checkDefaults, nb::arg("host_clock"));
  m.def("integrity_at_rest_by_default", &replay::integrityAtRestByDefault, nb::arg("replicas"),
        nb::arg("smallest_group"));

  nb::class_<replay::StragglerTracker>(m, "StragglerTracker")
      .def(nb::init<replay::StragglerOptions>(), nb::arg("options"))
      .def(
          "observe",
          [](replay::StragglerTracker& t, const std::string& recipe, std::int64_t step,
             const std::vector<std::vector<double>>& repetitions, const std::vector<std::int64_t>& ranks) {
            auto v = t.observe(recipe, step, repetitions, ranks);
            return std::make_tuple(v.check, v.confirmed, v.outlier_checks);
          },
          nb::arg("recipe"), nb::arg("step"), nb::arg("repetitions"), nb::arg("peer_ranks"),
          "(timing consensus on each peer's fastest repetition, confirmed by position, outlier checks in the window).");
}

}  // namespace lmr::python
