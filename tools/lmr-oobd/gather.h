// The stall-time exchange of lmr-oobd over Gloo: a fresh context among the round's members,
// connected as a ring (each member to its two neighbours) through an lmr::oob::Store, and
// one gloo::allgather of fixed-size records, bounded by a deadline. Nothing of it outlives the call, so no socket
// stays open between stalls.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "lmr/oob/store.h"

namespace gloo::transport {
class Device;
}

namespace lmr::oobd {

// The TCP device the meshes are built on (no socket until a mesh is built). `hostname` is
// the address peers connect to; `iface`, when set, picks the interface instead.
std::shared_ptr<gloo::transport::Device> makeDevice(const std::string& hostname, const std::string& iface);

// All members call it with the same `prefix` and `members`, each its own `index` and a
// record of `record_bytes`; returns every member's record in member order. Throws
// lmr::TimeoutError or lmr::PeerFailure when a member does not take part before `deadline`.
std::vector<std::string> allgather(oob::Store& store, const std::string& prefix, int index, int members,
                                   const std::string& record, std::chrono::steady_clock::time_point deadline,
                                   const std::shared_ptr<gloo::transport::Device>& device);

}  // namespace lmr::oobd
