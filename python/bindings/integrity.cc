// Bindings of lmr::replay's state-integrity decisions (include/lmr/replay/integrity.h).
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "lmr/common/error.h"
#include "lmr/replay/integrity.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

// A peer's detail as Python sends it: (tensor kinds as bytes of 0/1, digests after the
// update concatenated, tensor indices changed at rest, error text).
//
// Digests cross as 16 bytes a tensor; 16 zero bytes stand for a tensor not signed at that
// boundary (lmr::replay's empty digest; a real one is all zeros with probability 2^-128).
using DetailSpec = std::tuple<nb::bytes, nb::bytes, std::vector<std::int64_t>, std::string>;

constexpr char kUnsigned[16] = {};

std::vector<std::string> split16(const nb::bytes& b, const char* what) {
  const std::string_view all(b.c_str(), b.size());
  if (all.size() % 16 != 0) throw InvalidArgument(std::string("state integrity: ") + what + " is not whole digests");
  std::vector<std::string> out;
  for (std::size_t at = 0; at < all.size(); at += 16) {
    const std::string_view d = all.substr(at, 16);
    out.emplace_back(d == std::string_view(kUnsigned, 16) ? std::string_view() : d);
  }
  return out;
}

std::vector<bool> kinds(const nb::bytes& b) {
  std::vector<bool> out;
  for (std::size_t i = 0; i < b.size(); ++i) out.push_back(b.c_str()[i] != 0);
  return out;
}

DetailSpec detailSpec(const replay::IntegrityDetail& d) {
  std::string k, after;
  for (bool s : d.is_state) k.push_back(s ? 1 : 0);
  for (const std::string& a : d.after) after += a.empty() ? std::string(kUnsigned, 16) : a;
  return {asBytes(k), asBytes(after), d.changed_at_rest, d.error};
}

replay::IntegrityDetail detailOf(const DetailSpec& spec) {
  replay::IntegrityDetail d;
  d.is_state = kinds(std::get<0>(spec));
  d.after = split16(std::get<1>(spec), "a detail's digests");
  d.changed_at_rest = std::get<2>(spec);
  d.error = std::get<3>(spec);
  return d;
}

std::vector<replay::IntegritySummary> summariesOf(const std::vector<nb::bytes>& packed) {
  std::vector<replay::IntegritySummary> out;
  for (const nb::bytes& b : packed) out.push_back(replay::IntegritySummary::unpack({b.c_str(), b.size()}));
  return out;
}

}  // namespace

void registerIntegrity(nb::module_& m) {
  m.attr("INTEGRITY_RECIPE") = replay::kIntegrityRecipe;  // the recipe id of state-integrity results
  m.def(
      "integrity_local",
      [](const nb::bytes& layout, const nb::bytes& is_state, const nb::bytes& after,
         const std::optional<nb::bytes>& reference, const std::optional<nb::bytes>& before) {
        replay::HeldState held;
        held.layout = std::string(layout.c_str(), layout.size());
        held.is_state = kinds(is_state);
        held.after = split16(after, "the digests after the update");
        if (reference && before) {
          held.reference = split16(*reference, "the reference digests");
          held.before = split16(*before, "the digests before the update");
        }
        const replay::LocalIntegrity local = replay::localIntegrity(held);
        return std::make_pair(asBytes(local.summary.pack()), detailSpec(local.detail));
      },
      nb::arg("layout"), nb::arg("is_state"), nb::arg("after"), nb::arg("reference").none(), nb::arg("before").none(),
      "(64-byte summary, detail) of this peer's held state (lmr::replay::localIntegrity); digests are "
      "concatenated 16-byte values in the set's order, is_state one byte per tensor.");
  m.def("integrity_slices", &replay::integritySlices, nb::arg("bytes"), nb::arg("slices"),
        "The slice (0..slices-1) of each tensor, by its bytes (lmr::replay::integritySlices).");
  m.def("integrity_worst_latency", &replay::integrityLatency, nb::arg("slices"), nb::arg("pipelined"),
        "Worst-case steps until a diverged replica is named (lmr::replay::integrityLatency).");
  m.def(
      "integrity_failed",
      [](const std::string& error) {
        const replay::LocalIntegrity local = replay::failedIntegrity(error);
        return std::make_pair(asBytes(local.summary.pack()), detailSpec(local.detail));
      },
      nb::arg("error"), "(summary, detail) of a peer that could not take its digests.");
  m.def(
      "integrity_needs_detail",
      [](const std::vector<std::int64_t>& ranks, const std::vector<std::vector<std::int64_t>>& state_groups,
         bool replicas, const std::vector<nb::bytes>& summaries) {
        return replay::integrityNeedsDetail(replay::PeerLayout{ranks, state_groups}, replicas, summariesOf(summaries));
      },
      nb::arg("ranks"), nb::arg("state_groups"), nb::arg("replicas"), nb::arg("summaries"));
  m.def(
      "integrity_decide",
      [](const std::vector<std::int64_t>& ranks, const std::vector<std::vector<std::int64_t>>& state_groups,
         bool replicas, const std::vector<nb::bytes>& summaries, const std::vector<DetailSpec>& details) {
        std::vector<replay::IntegrityDetail> d;
        for (const DetailSpec& spec : details) d.push_back(detailOf(spec));
        replay::IntegrityVerdict v =
            replay::decideIntegrity(replay::PeerLayout{ranks, state_groups}, replicas, summariesOf(summaries), d);
        return std::make_pair(std::move(v.check), std::move(v.tensors));
      },
      nb::arg("ranks"), nb::arg("state_groups"), nb::arg("replicas"), nb::arg("summaries"), nb::arg("details"),
      "(CheckVerdict over integrity.params / integrity.state, {surface: tensor indices by peer position}).");
}

}  // namespace lmr::python
