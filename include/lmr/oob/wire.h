// What lmr-oobd daemons say to each other, and the strict readers of everything a daemon
// receives: rendezvous-store requests and replies, store keys, round membership, round
// numbers, host names, gathered views and adopted reports.
//
// Every message carries the job's token as a key: store requests, store replies and the
// gathered views are tagged with HMAC-SHA256(token, ...), and the reader checks the tag
// before it looks at anything else, so a peer without the token can change no state and
// plant no view. Readers never throw anything but lmr::Error: a malformed message is a
// PeerFailure (or InvalidArgument) naming what is wrong, which the daemon logs and drops.
// Pure functions, no I/O: the fuzz targets (fuzz/oob_*_fuzz.cc) call them directly.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmr::oob {

using Tag = std::array<std::uint8_t, 32>;

// HMAC-SHA256 (RFC 2104) of `message` under `key`.
Tag hmacSha256(std::string_view key, std::string_view message);
// Equal bytes, in time independent of where they differ.
bool sameBytes(std::string_view a, std::string_view b);

// ---- the rendezvous store protocol ----------------------------------------------------------
//
// One request per connection:
//   op u8 | key length u32 (big-endian) | key | value length u32 | value | tag[32]
//   tag = HMAC(token, "lmr.oob.req" | op | key length | key | value length | value)
// and its reply:
//   status u8 | value length u32 | value | tag[32]
//   tag = HMAC(token, "lmr.oob.rep" | the request's tag | status | value length | value)
// (a reply is bound to its request: an old reply cannot be played back).

inline constexpr std::uint8_t kStoreSet = 1, kStoreGet = 2, kStoreClaim = 3;
inline constexpr std::uint8_t kStatusNo = 0, kStatusYes = 1, kStatusFull = 2;
inline constexpr std::size_t kMaxStoreKey = 512;
inline constexpr std::size_t kMaxStoreValue = 1 << 20;
inline constexpr std::size_t kStoreFrameOverhead = 1 + 4 + 4 + 32;

// A key: 1..kMaxStoreKey bytes of [A-Za-z0-9._:/-]. Throws InvalidArgument naming the key.
void checkStoreKey(std::string_view key);

struct StoreRequest {
  std::uint8_t op = 0;
  std::string key, value;
  Tag tag{};
};

std::string encodeRequest(std::string_view token, std::uint8_t op, std::string_view key, std::string_view value);
// The whole frame. Throws PeerFailure for a wrong length, op, key or tag.
StoreRequest decodeRequest(std::string_view token, std::string_view frame);

std::string encodeReply(std::string_view token, const Tag& request_tag, std::uint8_t status, std::string_view value);
// (status, value) of the reply to the request tagged `request_tag`. Throws PeerFailure.
std::pair<std::uint8_t, std::string> decodeReply(std::string_view token, const Tag& request_tag,
                                                 std::string_view frame);

// The server's data, with bounds on what a client (even one holding the token) can make it
// hold: beyond `max_keys` keys or `max_bytes` of keys and values, new keys are refused
// (kStatusFull) and nothing changes. Nothing is erased during a job: set-up writes about a key
// per daemon and a stall round about 1.5 (views, the nodes' keys, Gloo's addresses), so the
// default bounds hold a peer group of 16,384 daemons for about 25 stall rounds (the bytes
// bound comes first; docs/scale.md).
class StoreState {
 public:
  explicit StoreState(std::size_t max_keys = 1 << 20, std::size_t max_bytes = std::size_t{256} << 20)
      : max_keys_(max_keys), max_bytes_(max_bytes) {}
  // Applies a decoded request: (status, value).
  std::pair<std::uint8_t, std::string> apply(const StoreRequest& request);
  std::size_t keys() const { return data_.size(); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t max_keys_, max_bytes_, bytes_ = 0;
  std::map<std::string, std::string> data_;
};

// ---- values found in the store ----------------------------------------------------------------

// "members/<round>": the member indices that joined, ascending, distinct, each in [0, n),
// comma-separated decimal, at least one. Throws PeerFailure.
std::vector<std::int64_t> parseMembers(std::string_view text, std::int64_t n);
std::string formatMembers(const std::vector<std::int64_t>& members);
// "latest": a round number, decimal, 1..1e12. Throws PeerFailure.
std::int64_t parseRound(std::string_view text);
// "ready/<index>": a host name, 1..63 printable bytes without spaces. Throws PeerFailure.
std::string parseHost(std::string_view text);
// "hosts/<chunk>" (concatenated): every member's host, names stated once: the number of
// distinct names, a line each, then each member's name as an index into them, comma-separated:
// "2\nnode-a\nnode-b\n0,0,1,1". Strict: n members, distinct well-formed names, every name used.
// Throws PeerFailure.
std::string formatHosts(const std::vector<std::string>& hosts);
std::vector<std::string> parseHosts(std::string_view text, std::int64_t n);

// ---- the views gathered in a stall round --------------------------------------------------------

// One daemon's view as it travels (native byte order: every daemon of a job runs the same
// build), followed by its tag: HMAC(token, "lmr.oob.view" | context | record), `context`
// naming the round (the key prefix of its mesh), so a view cannot be replayed into
// another round.
struct ViewRecord {
  std::int64_t rank = 0, layer = 0, stalled_ns = 0;
  std::uint64_t step = 0, layer_calls = 0, group = 0, meta = 0, sequence = 0;
  std::uint32_t op = 0, reduce_or_root = 0, in_collective = 0, pad = 0;
  std::int64_t dataloader_ns = 0, dataloader_observed_ns = 0, dataloader_last_ns = 0;
  std::int64_t checkpoint_ns = 0, checkpoint_observed_ns = 0, checkpoint_last_ns = 0;
  char host[64] = {};
};
inline constexpr std::size_t kViewBytes = sizeof(ViewRecord) + 32;

std::string encodeView(std::string_view token, std::string_view context, const ViewRecord& view);
// Throws PeerFailure for a wrong size or tag, a rank other than `expected_rank`, a
// negative duration, a flag other than 0/1, non-zero padding or a host that is not a
// NUL-terminated printable name.
ViewRecord decodeView(std::string_view token, std::string_view context, std::string_view bytes,
                      std::int64_t expected_rank);

// A node leader's share of a two-level round's gather (tools/lmr-oobd/observer.h): its
// node's present members as `slots` fixed slots of (member index, i64 native order; the
// member's encoded view, kViewBytes), unused slots with index -1 and zero bytes, so every
// leader sends the same size. Views travel as their daemons tagged them; the reader checks
// each with decodeView.
inline constexpr std::size_t kNodeSlotBytes = 8 + kViewBytes;
struct NodeView {
  std::int64_t index = 0;
  std::string view;  // kViewBytes, as encodeView made it
};
std::string encodeNodeViews(const std::vector<NodeView>& views, std::size_t slots);
// Throws PeerFailure for a wrong size, an index outside [0, n) (or -1 in a used slot), a
// used slot after an unused one, indices not ascending, or an unused slot with data.
std::vector<NodeView> decodeNodeViews(std::string_view bytes, std::size_t slots, std::int64_t n);

}  // namespace lmr::oob
