// Where the lmr-oobd daemons of one job meet over TCP when no port is configured.
#pragma once

#include <cstdint>
#include <string_view>

namespace lmr::oob {

inline constexpr std::int64_t kDerivedPortBase = 20000;
inline constexpr std::int64_t kDerivedPortSpan = 30000;

// The daemons' TCP port for one (run, generation), in [kDerivedPortBase, base + span):
//   h = first 8 bytes, big-endian, of SHA-256("lmr-oob|<run_id>|<master_port>")
//   port = base + (h + generation) mod span, or the next one when that equals master_port.
// Successive generations step to the next port (a successor never reuses the listener of a
// predecessor still shutting down); different run ids land on unrelated ports. Pure.
std::int64_t derivedPort(std::string_view run_id, std::int64_t generation, std::int64_t master_port = 0);

}  // namespace lmr::oob
