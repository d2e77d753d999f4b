// Bindings of the in-memory tier's decisions (include/lmr/ckpt/memory_tier.h): the replica ring,
// the memory budget, the restore plan and the flushed slot's header.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "lmr/ckpt/memory_tier.h"

namespace nb = nanobind;

namespace lmr::python {

using namespace lmr::ckpt;

namespace {

ReplicaRing ring(std::int64_t world, std::int64_t per_node, std::int64_t jump) {
  ReplicaRing r{world, per_node, jump};
  checkRing(r);
  return r;
}

}  // namespace

void registerMemoryTier(nb::module_& m) {
  m.def("memory_default_jump", &defaultJump, nb::arg("world"), nb::arg("per_node"),
        "The in-memory tier's default replication jump: one node further (1 on a single node).");
  m.def(
      "memory_check_ring",
      [](std::int64_t world, std::int64_t per_node, std::int64_t jump) { ring(world, per_node, jump); },
      nb::arg("world"), nb::arg("per_node"), nb::arg("jump"),
      "Raises InvalidArgumentError for a ring that keeps a replica on its owner's node (naming the rank).");
  m.def(
      "memory_holder_of",
      [](std::int64_t world, std::int64_t per_node, std::int64_t jump, std::int64_t rank) {
        return holderOf(ring(world, per_node, jump), rank);
      },
      nb::arg("world"), nb::arg("per_node"), nb::arg("jump"), nb::arg("rank"));
  m.def(
      "memory_owner_of",
      [](std::int64_t world, std::int64_t per_node, std::int64_t jump, std::int64_t holder) {
        return ownerOf(ring(world, per_node, jump), holder);
      },
      nb::arg("world"), nb::arg("per_node"), nb::arg("jump"), nb::arg("holder"));
  m.def(
      "memory_lost_owners",
      [](std::int64_t world, std::int64_t per_node, std::int64_t jump, const std::vector<std::int64_t>& lost) {
        return lostOwners(ring(world, per_node, jump), lost);
      },
      nb::arg("world"), nb::arg("per_node"), nb::arg("jump"), nb::arg("lost_nodes"),
      "The ranks whose state is gone when these nodes are (own node and holder's both lost).");
  m.def(
      "memory_check_budget",
      [](std::uint64_t own, std::uint64_t held, std::int64_t slots, std::uint64_t host, std::int64_t ranks_on_node,
         double fraction) {
        const MemoryBudget b{own, held, slots, host, ranks_on_node, fraction};
        return std::make_tuple(checkBudget(b), nodeBytes(b));
      },
      nb::arg("own_bytes"), nb::arg("held_bytes"), nb::arg("slots"), nb::arg("host_bytes"), nb::arg("ranks_on_node"),
      nb::arg("fraction"), "(problem or \"\", the node's bytes for every slot).");
  m.def("memory_stage_on_device", &stageOnDevice, nb::arg("snapshot_bytes"), nb::arg("free_device_bytes"),
        nb::arg("share"), "Whether staging \"auto\" stages a capture in device memory (lmr::ckpt::stageOnDevice).");
  m.def(
      "memory_plan_restore",
      [](const std::vector<std::vector<std::int64_t>>& have, const std::vector<std::int64_t>& need) {
        const RestorePlan plan = planRestore(have, need);
        std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> out;
        for (const auto& t : plan.transfers) out.emplace_back(t.from, t.to, t.owner);
        return std::make_tuple(out, plan.missing);
      },
      nb::arg("have"), nb::arg("need"), "([(from, to, owner)], missing): who sends which owner's snapshot to whom.");
  m.def(
      "memory_slot_header",
      [](std::int64_t step, std::int64_t owner, std::int64_t world, const std::string& topology,
         std::uint64_t meta_bytes, std::uint64_t data_bytes, const std::string& digest) {
        return toJson(SlotHeader{step, owner, world, topology, meta_bytes, data_bytes, digest});
      },
      nb::arg("step"), nb::arg("owner"), nb::arg("world"), nb::arg("topology"), nb::arg("meta_bytes"),
      nb::arg("data_bytes"), nb::arg("digest"), "A flushed slot's header as JSON text.");
  m.def(
      "memory_parse_slot_header",
      [](const std::string& text, const std::string& source) {
        const SlotHeader h = parseSlotHeader(text, source);
        return std::make_tuple(h.step, h.owner, h.world, h.topology, h.meta_bytes, h.data_bytes, h.digest);
      },
      nb::arg("text"), nb::arg("source") = "slot header",
      "(step, owner, world, topology, meta_bytes, data_bytes, digest); InvalidArgumentError naming the field.");
}

}  // namespace lmr::python
