// Bindings of lmr::mesh's communication-straggler decisions (include/lmr/mesh/comm.h).
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "lmr/mesh/comm.h"
#include "lmr/mesh/fabric.h"

namespace nb = nanobind;

namespace lmr::python {

// One record as Python sends it: (group id, members, call index, collective, bytes, wait
// seconds, transfer seconds, group size); members empty when the group id is a key, of the
// group table or, with a size, of the ranks that recorded the call (lmr::mesh::CollectiveRecord).
using RecordSpec = std::tuple<std::string, std::vector<std::int64_t>, std::int64_t, std::string, std::uint64_t, double,
                              double, std::int64_t>;
// A fabric finding: (reporting rank, "nic" or "switch", name, detail).
using FindingSpec = std::tuple<std::int64_t, std::string, std::string, std::string>;
// The round's group table: key -> (group id, members).
using GroupSpecs = std::map<std::string, std::tuple<std::string, std::vector<std::int64_t>>>;

void registerMesh(nb::module_& m) {
  using mesh::CommTracker;
  using mesh::CommVerdict;
  using mesh::ResourceMap;
  using mesh::Resources;

  nb::class_<Resources>(m, "Resources")
      .def_ro("host", &Resources::host)
      .def_ro("nic", &Resources::nic)
      .def_ro("switch", &Resources::switch_name);

  nb::class_<ResourceMap>(m, "ResourceMap")
      .def_static("from_json", &ResourceMap::fromJson, nb::arg("text"), nb::arg("world_size"),
                  "A resource map file's text (strict JSON, version 1); InvalidArgumentError names the JSON path.")
      .def_static("from_hosts", &ResourceMap::fromHosts, nb::arg("hosts"), "Host names gathered from every rank.")
      .def("of", &ResourceMap::of, nb::arg("rank"), nb::rv_policy::copy)
      .def_prop_ro("world_size", &ResourceMap::worldSize);

  nb::class_<mesh::FabricReading>(m, "FabricReadingCore")
      .def_ro("kind", &mesh::FabricReading::kind)
      .def_ro("name", &mesh::FabricReading::name)
      .def_ro("degraded", &mesh::FabricReading::degraded)
      .def_ro("detail", &mesh::FabricReading::detail);

  nb::class_<mesh::InfinibandCounters>(m, "InfinibandCounters")
      .def(nb::init<std::string, std::vector<std::string>>(), nb::arg("root"), nb::arg("nics"),
           "RDMA NIC ports under `root` (sysfs); UnsupportedError when there are none (lmr::mesh::InfinibandCounters).")
      .def("poll", &mesh::InfinibandCounters::poll, nb::call_guard<nb::gil_scoped_release>(),
           "One reading per NIC: degraded while a port is not ACTIVE or an error counter grew since the last poll.")
      .def_prop_ro("nics", &mesh::InfinibandCounters::nics);

  nb::class_<mesh::FabricFinding>(m, "FabricFinding")
      .def_ro("reported_by", &mesh::FabricFinding::reported_by)
      .def_ro("kind", &mesh::FabricFinding::kind)
      .def_ro("name", &mesh::FabricFinding::name)
      .def_ro("detail", &mesh::FabricFinding::detail);

  nb::class_<CommVerdict>(m, "CommVerdict")
      .def_ro("slow_groups", &CommVerdict::slow_groups)
      .def_ro("candidate_groups", &CommVerdict::candidate_groups)
      .def_ro("late_ranks", &CommVerdict::late_ranks)
      .def_ro("rank", &CommVerdict::rank)
      .def_ro("resources", &CommVerdict::resources)
      .def_ro("fabric", &CommVerdict::fabric)
      .def_ro("reason", &CommVerdict::reason)
      .def_ro("observations", &CommVerdict::observations);

  nb::class_<CommTracker>(m, "CommTracker")
      .def(
          "__init__",
          [](CommTracker* t, std::int64_t confirmation_rounds, std::int64_t confirmation_checks,
             double pair_relative_threshold, double absolute_threshold) {
            mesh::CommOptions o;
            o.timing.absolute_threshold = absolute_threshold;
            o.confirmation_rounds = confirmation_rounds;
            o.confirmation_checks = confirmation_checks;
            o.pair_relative_threshold = pair_relative_threshold;
            new (t) CommTracker(o);
          },
          nb::arg("confirmation_rounds") = 3, nb::arg("confirmation_checks") = 5,
          nb::arg("pair_relative_threshold") = 0.5, nb::arg("absolute_threshold") = 1e-3)
      .def(
          "observe",
          [](CommTracker& t, std::int64_t step, const std::vector<std::vector<RecordSpec>>& records_by_rank,
             const ResourceMap* map, const std::vector<FindingSpec>& fabric, const GroupSpecs& group_specs) {
            std::vector<std::vector<mesh::CollectiveRecord>> by_rank(records_by_rank.size());
            for (std::size_t r = 0; r < records_by_rank.size(); ++r)
              for (const auto& [group, members, call, collective, bytes, wait, transfer, size] : records_by_rank[r])
                by_rank[r].push_back(
                    mesh::CollectiveRecord{group, members, call, collective, bytes, wait, transfer, size});
            std::vector<mesh::FabricFinding> findings;
            for (const auto& [rank, kind, name, detail] : fabric)
              findings.push_back(mesh::FabricFinding{rank, kind, name, detail});
            mesh::GroupTable groups;
            for (const auto& [key, spec] : group_specs)
              groups.emplace(key, mesh::GroupEntry{std::get<0>(spec), std::get<1>(spec)});
            nb::gil_scoped_release release;
            return t.observe(step, mesh::completeObservations(by_rank, groups), map, findings);
          },
          nb::arg("step"), nb::arg("records_by_rank"), nb::arg("resource_map").none() = nb::none(),
          nb::arg("fabric") = std::vector<FindingSpec>{}, nb::arg("groups") = GroupSpecs{},
          "One round: every rank's collective records (group, members, call, collective, bytes, wait, "
          "transfer, group size; members empty where `groups` maps the group key to (group id, members), "
          "or where the group is the ranks that recorded the call, `group size` of them), made into "
          "complete observations (lmr::mesh::completeObservations), and fabric findings "
          "(reporting rank, kind, name, detail) (lmr::mesh::CommTracker::observe): slow groups, late ranks, "
          "the one rank they share, and the fabric finding that narrows it.");
}

}  // namespace lmr::python
