// Bindings of lmr::oob progress records (the training side of hang detection), the collective
// op codes and fingerprint digest they carry, and the daemons' derived rendezvous port. The
// publish methods are the hot path: no GIL release, no allocation, a few nanoseconds each.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include "bindings.h"
#include "lmr/common/error.h"
#include "lmr/oob/collective_ops.h"
#include "lmr/oob/progress.h"
#include "lmr/oob/rendezvous.h"
#include "lmr/oob/watch.h"

namespace nb = nanobind;

namespace lmr::python {

void registerOob(nb::module_& m) {
  m.def(
      "oob_segment_name",
      [](const std::string& run_id, std::int64_t generation, std::int64_t pid, const std::string& group,
         std::int64_t rank) { return oob::segmentName(run_id, generation, pid, group, rank); },
      nb::arg("run_id"), nb::arg("generation"), nb::arg("pid"), nb::arg("group"), nb::arg("rank"),
      "The shared-memory name of one rank's progress record.");
  m.def("oob_now_ns", &oob::nowNs, "CLOCK_MONOTONIC in nanoseconds (the records' clock).");
  m.def("oob_derived_port", &oob::derivedPort, nb::arg("run_id"), nb::arg("generation"), nb::arg("master_port") = 0,
        "The daemons' TCP port for one (run, generation); never master_port (lmr::oob::derivedPort).");

  nb::class_<oob::WatchOptions>(m, "WatchOptions")
      .def(nb::init<>())
      .def_rw("threshold_s", &oob::WatchOptions::threshold_s)
      .def_rw("warmup_threshold_s", &oob::WatchOptions::warmup_threshold_s)
      .def_rw("poll_s", &oob::WatchOptions::poll_s)
      .def_rw("join_s", &oob::WatchOptions::join_s)
      .def_rw("gather_s", &oob::WatchOptions::gather_s)
      .def_rw("setup_timeout_s", &oob::WatchOptions::setup_timeout_s)
      .def_rw("io_absolute_s", &oob::WatchOptions::io_absolute_s)
      .def_rw("io_relative", &oob::WatchOptions::io_relative)
      .def_rw("io_persistence_s", &oob::WatchOptions::io_persistence_s)
      .def("validate", &oob::WatchOptions::validate, nb::arg("owner") = "WatchOptions",
           "Raises InvalidArgumentError naming the first field that is not a positive number.");

  nb::dict ops;
  for (const oob::CollectiveOp& op : oob::collectiveOps()) ops[nb::str(op.name.data(), op.name.size())] = op.code;
  m.attr("COLLECTIVE_OPS") = ops;
  m.attr("FIRST_INTERNAL_COLLECTIVE_OP") = oob::kFirstInternalCollectiveOp;
  m.def(
      "fingerprint_digest", [](const std::string& text) { return oob::fingerprintDigest(text); }, nb::arg("text"),
      "The digest of a group membership or fixed tensor metadata in a collective fingerprint (CRC-32).");

  nb::class_<oob::ProgressWriter>(m, "ProgressWriter")
      .def(
          "__init__",
          [](oob::ProgressWriter* self, const std::string& name, nb::bytes token) {
            new (self) oob::ProgressWriter(name, std::string(token.c_str(), token.size()));
          },
          nb::arg("name"), nb::arg("token"))
      .def_prop_ro("name", &oob::ProgressWriter::name)
      .def("close", &oob::ProgressWriter::close, "Unlinks the record; later updates are dropped.")
      .def("step_completed", &oob::ProgressWriter::stepCompleted, nb::arg("step"))
      .def("layer_entered", &oob::ProgressWriter::layerEntered, nb::arg("layer"))
      .def(
          "collective_entered",
          [](oob::ProgressWriter& w, std::uint32_t op, std::uint32_t reduce_or_root, std::uint64_t group,
             std::uint64_t meta,
             std::uint64_t sequence) { w.collectiveEntered({op, reduce_or_root, group, meta, sequence}); },
          nb::arg("op"), nb::arg("reduce_or_root"), nb::arg("group"), nb::arg("meta"), nb::arg("sequence"))
      .def("collective_exited", &oob::ProgressWriter::collectiveExited)
      .def("dataloader_begin", &oob::ProgressWriter::dataloaderBegin)
      .def("dataloader_end", &oob::ProgressWriter::dataloaderEnd)
      .def("checkpoint_begin", &oob::ProgressWriter::checkpointBegin)
      .def("checkpoint_end", &oob::ProgressWriter::checkpointEnd);

  nb::class_<oob::ProgressReader>(m, "ProgressReader")
      .def(nb::init<const std::string&>(), nb::arg("name"))
      .def("snapshot", [](const oob::ProgressReader& r) -> nb::object {
        const std::optional<oob::Snapshot> s = r.snapshot();
        if (!s) return nb::none();
        nb::dict d;
        d["step"] = s->step;
        d["layer"] = s->layer;
        d["layer_calls"] = s->layer_calls;
        d["in_collective"] = s->in_collective;
        d["collective"] = nb::make_tuple(s->collective.op, s->collective.reduce_or_root, s->collective.group,
                                         s->collective.meta, s->collective.sequence);
        d["progress_ns"] = s->progress_ns;
        d["dataloader_since_ns"] = s->dataloader_since_ns;
        d["dataloader_last_ns"] = s->dataloader_last_ns;
        d["checkpoint_since_ns"] = s->checkpoint_since_ns;
        d["checkpoint_last_ns"] = s->checkpoint_last_ns;
        d["owner_pid"] = s->owner_pid;
        return d;
      });
}

}  // namespace lmr::python
