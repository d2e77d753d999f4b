// libFuzzer target: the rendezvous store's wire protocol (lmr/oob/wire.h), as the serving
// daemon and its clients read it. Raw bytes must be refused (they cannot carry the job's
// token); requests built from the input with the token must round-trip or be refused as
// InvalidArgument; applying them keeps the store within its bounds. Only lmr::Error may
// leave a reader. Run with `make fuzz`.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lmr/common/error.h"
#include "lmr/oob/wire.h"

namespace {

const std::string kToken = "fuzz-token-0123456789";
lmr::oob::StoreState g_state(/*max_keys=*/256, /*max_bytes=*/1 << 16);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lmr::oob;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.empty()) return 0;
  const std::string_view rest = in.substr(1);
  const Tag some_tag{};
  switch (static_cast<std::uint8_t>(in[0]) % 4) {
    case 0:  // a frame off the network: never accepted without the token
      try {
        decodeRequest(kToken, rest);
        __builtin_trap();
      } catch (const lmr::Error&) {
      }
      break;
    case 1: {  // a token holder's request: op, key length, key, value
      if (rest.size() < 2) return 0;
      const auto op = static_cast<std::uint8_t>(rest[0]);
      const std::size_t klen = static_cast<std::uint8_t>(rest[1]);
      const std::string_view key = rest.substr(2, klen);
      const std::string_view value = rest.size() > 2 + klen ? rest.substr(2 + klen) : std::string_view();
      std::string frame;
      try {
        frame = encodeRequest(kToken, op, key, value);
      } catch (const lmr::InvalidArgument&) {
        return 0;
      }
      try {
        const StoreRequest r = decodeRequest(kToken, frame);
        if (r.op != op || r.key != key || r.value != value) __builtin_trap();
        const std::size_t keys = g_state.keys();
        const auto [status, answer] = g_state.apply(r);
        if (g_state.keys() > 256 || g_state.bytes() > (1u << 16)) __builtin_trap();
        if (status == kStatusFull && g_state.keys() != keys) __builtin_trap();
        if (decodeReply(kToken, r.tag, encodeReply(kToken, r.tag, status, answer)).second != answer) __builtin_trap();
      } catch (const lmr::PeerFailure&) {  // an unknown op
        if (op == kStoreSet || op == kStoreGet || op == kStoreClaim) __builtin_trap();
      }
      break;
    }
    case 2:  // a reply off the network
      try {
        decodeReply(kToken, some_tag, rest);
        __builtin_trap();
      } catch (const lmr::Error&) {
      }
      break;
    default:  // a key
      try {
        checkStoreKey(rest);
      } catch (const lmr::InvalidArgument&) {
      }
  }
  return 0;
}
