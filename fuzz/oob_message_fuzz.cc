// libFuzzer target: what a daemon reads from its peers during a stall round
// (lmr/oob/wire.h, lmr/oob/report.h): round membership, round numbers, host names and
// tables, the gathered views (raw, and re-tagged with the job's token so the field checks
// are reached), a node leader's share of views and the stored report a late daemon adopts.
// Only lmr::Error may leave a reader; an accepted view satisfies every documented bound.
// Run with `make fuzz`.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "lmr/common/error.h"
#include "lmr/oob/report.h"
#include "lmr/oob/wire.h"

namespace {
const std::string kToken = "fuzz-token-0123456789";
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lmr::oob;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.size() < 2) return 0;
  const std::string_view rest = in.substr(2);
  const auto n = static_cast<std::int64_t>(static_cast<std::uint8_t>(in[1])) + 1;
  try {
    switch (static_cast<std::uint8_t>(in[0]) % 7) {
      case 0: {
        const auto members = parseMembers(rest, n);
        for (std::size_t i = 0; i < members.size(); ++i)
          if (members[i] < 0 || members[i] >= n || (i > 0 && members[i] <= members[i - 1])) __builtin_trap();
        if (formatMembers(members) != rest) __builtin_trap();
        break;
      }
      case 1:
        if (const std::int64_t r = parseRound(rest); r < 1 || std::to_string(r) != rest) __builtin_trap();
        break;
      case 2:
        if (!rest.empty() && rest[0] == 'T') {  // a host table: a round trip
          const auto hosts = parseHosts(rest.substr(1), n);
          if (static_cast<std::int64_t>(hosts.size()) != n || parseHosts(formatHosts(hosts), n) != hosts)
            __builtin_trap();
        } else {
          parseHost(rest);
        }
        break;
      case 3:  // a view off the network: it cannot carry the job's token
        decodeView(kToken, "oob-x/mesh/1/", rest, n);
        __builtin_trap();
      case 4: {  // a token holder's view: the field checks
        ViewRecord v;
        std::memcpy(&v, rest.data(), std::min(rest.size(), sizeof(v)));
        const ViewRecord back = decodeView(kToken, "c", encodeView(kToken, "c", v), n);
        if (back.rank != n || back.stalled_ns < 0 || back.in_collective > 1 ||
            std::memchr(back.host, '\0', sizeof(back.host)) == nullptr)
          __builtin_trap();
        break;
      }
      case 5: {  // a leader's share: whole slots, ascending indices in range, used slots first
        const std::size_t slots = rest.size() / kNodeSlotBytes;
        const auto views = decodeNodeViews(rest, slots, n);
        for (std::size_t i = 0; i < views.size(); ++i)
          if (views[i].index < 0 || views[i].index >= n || views[i].view.size() != kViewBytes ||
              (i > 0 && views[i].index <= views[i - 1].index))
            __builtin_trap();
        if (encodeNodeViews(views, slots) != rest) __builtin_trap();
        break;
      }
      default: toJson(parseReport(rest, "fuzz"));
    }
  } catch (const lmr::Error&) {
  }
  return 0;
}
