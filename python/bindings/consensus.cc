#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "lmr/consensus/consensus.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using consensus::ExactResult;
using consensus::Status;
using consensus::TimingOptions;
using consensus::TimingResult;

nb::list bytesList(const std::vector<std::string>& values) {
  nb::list out;
  for (const std::string& v : values) out.append(nb::bytes(v.data(), v.size()));
  return out;
}

}  // namespace

void registerConsensus(nb::module_& m) {
  nb::enum_<Status>(m, "Status")
      .value("Agree", Status::kAgree)
      .value("Attributed", Status::kAttributed)
      .value("Inconclusive", Status::kInconclusive);
  m.def(
      "worse_status",
      [](const std::string& a, const std::string& b) {
        return std::string(
            consensus::statusName(consensus::worse(consensus::parseStatus(a), consensus::parseStatus(b))));
      },
      nb::arg("a"), nb::arg("b"),
      "The worse of two status names (lmr::consensus::worse: Attributed > Inconclusive > Agree).");

  nb::class_<ExactResult>(m, "ExactResult")
      .def_ro("status", &ExactResult::status)
      .def_ro("bitmap", &ExactResult::bitmap, "True for each peer position that differs from the majority.")
      .def_prop_ro("evidence", [](const ExactResult& r) { return bytesList(r.evidence); })
      .def_ro("peer_ranks", &ExactResult::peer_ranks, "Global rank of each peer position.")
      .def_ro("majority_count", &ExactResult::majority_count)
      .def_ro("majority_position", &ExactResult::majority_position)
      .def_prop_ro("attributed_ranks", &ExactResult::attributedRanks);

  nb::class_<TimingOptions>(m, "TimingOptions")
      .def(
          "__init__",
          [](TimingOptions* o, double kappa, double scale_floor, double absolute_threshold, double relative_threshold,
             std::size_t min_peers) {
            new (o) TimingOptions{kappa, scale_floor, absolute_threshold, relative_threshold, min_peers};
          },
          nb::kw_only(), nb::arg("kappa") = TimingOptions{}.kappa, nb::arg("scale_floor") = TimingOptions{}.scale_floor,
          nb::arg("absolute_threshold") = TimingOptions{}.absolute_threshold,
          nb::arg("relative_threshold") = TimingOptions{}.relative_threshold,
          nb::arg("min_peers") = TimingOptions{}.min_peers)
      .def_rw("kappa", &TimingOptions::kappa)
      .def_rw("scale_floor", &TimingOptions::scale_floor)
      .def_rw("absolute_threshold", &TimingOptions::absolute_threshold)
      .def_rw("relative_threshold", &TimingOptions::relative_threshold)
      .def_rw("min_peers", &TimingOptions::min_peers);

  nb::class_<TimingResult>(m, "TimingResult")
      .def_ro("status", &TimingResult::status)
      .def_ro("bitmap", &TimingResult::bitmap, "True for each peer position that is a slow outlier.")
      .def_ro("evidence", &TimingResult::evidence)
      .def_ro("peer_ranks", &TimingResult::peer_ranks)
      .def_ro("median", &TimingResult::median)
      .def_ro("mad", &TimingResult::mad)
      .def_ro("scale", &TimingResult::scale)
      .def_prop_ro("attributed_ranks", &TimingResult::attributedRanks);

  m.def(
      "exact",
      [](const std::vector<nb::bytes>& evidence, const std::vector<std::int64_t>& peer_ranks) {
        std::vector<std::string> values;
        values.reserve(evidence.size());
        for (const nb::bytes& b : evidence) values.emplace_back(b.c_str(), b.size());
        return consensus::exact(values, peer_ranks);
      },
      nb::arg("evidence"), nb::arg("peer_ranks") = std::vector<std::int64_t>{},
      "Exact strict-majority consensus over one bytes value per peer position.");
  m.def(
      "timing",
      [](const std::vector<double>& seconds, const TimingOptions& options,
         const std::vector<std::int64_t>& peer_ranks) { return consensus::timing(seconds, options, peer_ranks); },
      nb::arg("seconds"), nb::arg("options") = TimingOptions{}, nb::arg("peer_ranks") = std::vector<std::int64_t>{},
      "Robust timing consensus (median and 1.4826 x MAD) over one timing per peer position.");
}

}  // namespace lmr::python
