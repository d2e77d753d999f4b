#include "lmr/oob/wire.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <type_traits>

#include "lmr/common/error.h"
#include "lmr/common/list.h"
#include "lmr/common/sha256.h"

namespace lmr::oob {
namespace {

static_assert(std::is_trivially_copyable_v<ViewRecord>);

std::string u32(std::size_t n) {
  const auto v = static_cast<std::uint32_t>(n);
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                     static_cast<char>(v)};
  return {b, 4};
}

// Reads a big-endian u32 at `*at`, advancing it; false when fewer than 4 bytes are left.
bool readU32(std::string_view s, std::size_t* at, std::uint32_t* out) {
  if (s.size() - *at < 4) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + *at);
  *out = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
  *at += 4;
  return true;
}

std::string_view tagBytes(const Tag& t) { return {reinterpret_cast<const char*>(t.data()), t.size()}; }

Tag requestTag(std::string_view token, std::uint8_t op, std::string_view key, std::string_view value) {
  std::string m = "lmr.oob.req";
  m += static_cast<char>(op);
  m += u32(key.size());
  m += key;
  m += u32(value.size());
  m += value;
  return hmacSha256(token, m);
}

Tag replyTag(std::string_view token, const Tag& request_tag, std::uint8_t status, std::string_view value) {
  std::string m = "lmr.oob.rep";
  m += tagBytes(request_tag);
  m += static_cast<char>(status);
  m += u32(value.size());
  m += value;
  return hmacSha256(token, m);
}

Tag viewTag(std::string_view token, std::string_view context, std::string_view record) {
  std::string m = "lmr.oob.view";
  m += u32(context.size());
  m += context;
  m += record;
  return hmacSha256(token, m);
}

// Non-negative decimal without sign, leading zeros or spaces, at most `max`.
std::optional<std::int64_t> decimal(std::string_view s, std::int64_t max) {
  if (s.empty() || s.size() > 13 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > max) return std::nullopt;
  return v;
}

bool printableName(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (unsigned char c : s)
    if (c <= 0x20 || c >= 0x7f) return false;
  return true;
}

std::string shown(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  return s.size() > 40 ? out + "..." : out;
}

}  // namespace

Tag hmacSha256(std::string_view key, std::string_view message) {
  std::array<std::uint8_t, 64> block{};
  if (key.size() > block.size()) {
    const Tag k = Sha256().update(key).finish();
    std::memcpy(block.data(), k.data(), k.size());
  } else {
    std::memcpy(block.data(), key.data(), key.size());
  }
  std::string inner(64, '\0'), outer(64, '\0');
  for (std::size_t i = 0; i < 64; ++i) {
    inner[i] = static_cast<char>(block[i] ^ 0x36);
    outer[i] = static_cast<char>(block[i] ^ 0x5c);
  }
  const Tag ih = Sha256().update(inner).update(message).finish();
  return Sha256().update(outer).update(tagBytes(ih)).finish();
}

bool sameBytes(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void checkStoreKey(std::string_view key) {
  if (key.empty() || key.size() > kMaxStoreKey)
    throw InvalidArgument("a rendezvous key must be 1.." + std::to_string(kMaxStoreKey) + " bytes, got " +
                          std::to_string(key.size()));
  for (unsigned char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) throw InvalidArgument("rendezvous key \"" + shown(key) + "\" holds a byte outside [A-Za-z0-9._:/-]");
  }
}

std::string encodeRequest(std::string_view token, std::uint8_t op, std::string_view key, std::string_view value) {
  checkStoreKey(key);
  if (value.size() > kMaxStoreValue) throw InvalidArgument("a rendezvous value is at most 1 MiB");
  std::string f;
  f.reserve(kStoreFrameOverhead + key.size() + value.size());
  f += static_cast<char>(op);
  f += u32(key.size());
  f += key;
  f += u32(value.size());
  f += value;
  f += tagBytes(requestTag(token, op, key, value));
  return f;
}

StoreRequest decodeRequest(std::string_view token, std::string_view frame) {
  std::size_t at = 1;
  std::uint32_t klen = 0, vlen = 0;
  if (frame.empty() || !readU32(frame, &at, &klen) || klen > kMaxStoreKey || frame.size() - at < klen)
    throw PeerFailure("a malformed rendezvous request (its key)");
  const std::string_view key = frame.substr(at, klen);
  at += klen;
  if (!readU32(frame, &at, &vlen) || vlen > kMaxStoreValue || frame.size() - at != std::size_t{vlen} + 32)
    throw PeerFailure("a malformed rendezvous request (its value or length)");
  const std::string_view value = frame.substr(at, vlen);
  StoreRequest r;
  std::memcpy(r.tag.data(), frame.data() + at + vlen, 32);
  r.op = static_cast<std::uint8_t>(frame[0]);
  // The tag first: nothing of an unauthenticated request is looked at further.
  if (!sameBytes(tagBytes(r.tag), tagBytes(requestTag(token, r.op, key, value))))
    throw PeerFailure("a rendezvous request without the job's token");
  if (r.op != kStoreSet && r.op != kStoreGet && r.op != kStoreClaim)
    throw PeerFailure("a rendezvous request with unknown op " + std::to_string(r.op));
  try {
    checkStoreKey(key);
  } catch (const InvalidArgument& e) {
    throw PeerFailure(std::string("a malformed rendezvous request: ") + e.what());
  }
  r.key.assign(key);
  r.value.assign(value);
  return r;
}

std::string encodeReply(std::string_view token, const Tag& request_tag, std::uint8_t status, std::string_view value) {
  std::string f;
  f += static_cast<char>(status);
  f += u32(value.size());
  f += value;
  f += tagBytes(replyTag(token, request_tag, status, value));
  return f;
}

std::pair<std::uint8_t, std::string> decodeReply(std::string_view token, const Tag& request_tag,
                                                 std::string_view frame) {
  std::size_t at = 1;
  std::uint32_t vlen = 0;
  if (frame.empty() || !readU32(frame, &at, &vlen) || vlen > kMaxStoreValue ||
      frame.size() - at != std::size_t{vlen} + 32)
    throw PeerFailure("a malformed rendezvous reply");
  const auto status = static_cast<std::uint8_t>(frame[0]);
  const std::string_view value = frame.substr(at, vlen);
  if (!sameBytes(frame.substr(at + vlen), tagBytes(replyTag(token, request_tag, status, value))))
    throw PeerFailure("a rendezvous reply without the job's token");
  if (status > kStatusFull) throw PeerFailure("a rendezvous reply with unknown status " + std::to_string(status));
  return {status, std::string(value)};
}

std::pair<std::uint8_t, std::string> StoreState::apply(const StoreRequest& r) {
  auto it = data_.find(r.key);
  if (r.op == kStoreGet)
    return it == data_.end() ? std::pair{kStatusNo, std::string()} : std::pair{kStatusYes, it->second};
  if (it != data_.end()) {
    if (r.op == kStoreClaim) return {kStatusNo, {}};
    if (bytes_ - it->second.size() + r.value.size() > max_bytes_) return {kStatusFull, {}};
    bytes_ = bytes_ - it->second.size() + r.value.size();
    it->second = r.value;
    return {kStatusYes, {}};
  }
  if (data_.size() >= max_keys_ || bytes_ + r.key.size() + r.value.size() > max_bytes_) return {kStatusFull, {}};
  bytes_ += r.key.size() + r.value.size();
  data_.emplace(r.key, r.value);
  return {kStatusYes, {}};
}

std::vector<std::int64_t> parseMembers(std::string_view text, std::int64_t n) {
  std::vector<std::int64_t> out;
  for (const std::string& item : splitCommaList(text)) {
    const auto v = decimal(item, n - 1);
    if (!v || (!out.empty() && *v <= out.back()))
      throw PeerFailure("a malformed round membership \"" + shown(text) + "\" (member indices of a group of " +
                        std::to_string(n) + ", ascending)");
    out.push_back(*v);
  }
  return out;
}

std::string formatMembers(const std::vector<std::int64_t>& members) {
  std::string out;
  for (std::int64_t x : members) {
    if (!out.empty()) out += ',';
    out += std::to_string(x);
  }
  return out;
}

std::int64_t parseRound(std::string_view text) {
  const auto v = decimal(text, 1'000'000'000'000);
  if (!v || *v < 1) throw PeerFailure("a malformed round number \"" + shown(text) + "\"");
  return *v;
}

std::string parseHost(std::string_view text) {
  if (!printableName(text)) throw PeerFailure("a malformed host name \"" + shown(text) + "\"");
  return std::string(text);
}

std::string formatHosts(const std::vector<std::string>& hosts) {
  std::map<std::string, std::size_t> id;
  std::string names, indices;
  for (const std::string& h : hosts) {
    const auto [it, fresh] = id.try_emplace(h, id.size());
    if (fresh) names += h + "\n";
    if (!indices.empty()) indices += ',';
    indices += std::to_string(it->second);
  }
  return std::to_string(id.size()) + "\n" + names + indices;
}

std::vector<std::string> parseHosts(std::string_view text, std::int64_t n) {
  const auto bad = [&](const std::string& what) { return PeerFailure("a malformed host table: " + what); };
  std::vector<std::string_view> lines;
  for (std::size_t at = 0;;) {
    const std::size_t end = text.find('\n', at);
    lines.push_back(text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
    if (end == std::string_view::npos) break;
    at = end + 1;
  }
  const auto distinct = decimal(lines[0], n);
  if (!distinct || *distinct < 1 || static_cast<std::size_t>(*distinct) + 2 != lines.size())
    throw bad("it must state 1 to " + std::to_string(n) + " names, a line each, then one line of indices");
  std::vector<std::string> names;
  std::set<std::string_view> seen;
  for (std::int64_t i = 1; i <= *distinct; ++i) {
    names.push_back(parseHost(lines[static_cast<std::size_t>(i)]));
    if (!seen.insert(lines[static_cast<std::size_t>(i)]).second) throw bad("host \"" + names.back() + "\" twice");
  }
  std::vector<std::string> out;
  std::vector<bool> used(names.size(), false);
  for (const std::string& item : splitCommaList(lines.back())) {
    const auto v = decimal(item, *distinct - 1);
    if (!v) throw bad("member " + std::to_string(out.size()) + "'s host \"" + shown(item) + "\"");
    used[static_cast<std::size_t>(*v)] = true;
    out.push_back(names[static_cast<std::size_t>(*v)]);
  }
  if (static_cast<std::int64_t>(out.size()) != n)
    throw bad(std::to_string(out.size()) + " members, the group has " + std::to_string(n));
  if (std::find(used.begin(), used.end(), false) != used.end()) throw bad("a name no member has");
  return out;
}

std::string encodeView(std::string_view token, std::string_view context, const ViewRecord& view) {
  const std::string record(reinterpret_cast<const char*>(&view), sizeof(view));
  return record + std::string(tagBytes(viewTag(token, context, record)));
}

ViewRecord decodeView(std::string_view token, std::string_view context, std::string_view bytes,
                      std::int64_t expected_rank) {
  if (bytes.size() != kViewBytes)
    throw PeerFailure("a malformed view (" + std::to_string(bytes.size()) + " bytes, not " +
                      std::to_string(kViewBytes) + ")");
  const std::string_view record = bytes.substr(0, sizeof(ViewRecord));
  if (!sameBytes(bytes.substr(sizeof(ViewRecord)), tagBytes(viewTag(token, context, record))))
    throw PeerFailure("a view without the job's token (or from another round)");
  ViewRecord v;
  std::memcpy(&v, record.data(), sizeof(v));
  const auto bad = [&](const std::string& what) {
    return PeerFailure("a malformed view from rank " + std::to_string(expected_rank) + ": " + what);
  };
  if (v.rank != expected_rank) throw bad("it names rank " + std::to_string(v.rank));
  if (v.layer < -1) throw bad("layer " + std::to_string(v.layer));
  for (std::int64_t d : {v.stalled_ns, v.dataloader_ns, v.dataloader_observed_ns, v.dataloader_last_ns, v.checkpoint_ns,
                         v.checkpoint_observed_ns, v.checkpoint_last_ns})
    if (d < 0) throw bad("a negative duration");
  if (v.in_collective > 1 || v.pad != 0) throw bad("a flag or padding out of range");
  const void* nul = std::memchr(v.host, '\0', sizeof(v.host));
  if (nul == nullptr) throw bad("an unterminated host name");
  const std::string_view host(v.host, static_cast<std::size_t>(static_cast<const char*>(nul) - v.host));
  if (!host.empty() && !printableName(host)) throw bad("host \"" + shown(host) + "\"");
  return v;
}

std::string encodeNodeViews(const std::vector<NodeView>& views, std::size_t slots) {
  if (views.size() > slots)
    throw InvalidArgument(std::to_string(views.size()) + " views do not fit " + std::to_string(slots) + " slots");
  std::string out(slots * kNodeSlotBytes, '\0');
  for (std::size_t s = 0; s < slots; ++s) {
    char* slot = out.data() + s * kNodeSlotBytes;
    const std::int64_t index = s < views.size() ? views[s].index : -1;
    std::memcpy(slot, &index, sizeof(index));
    if (s >= views.size()) continue;
    if (views[s].view.size() != kViewBytes)
      throw InvalidArgument("a view of " + std::to_string(views[s].view.size()) + " bytes");
    std::memcpy(slot + 8, views[s].view.data(), kViewBytes);
  }
  return out;
}

std::vector<NodeView> decodeNodeViews(std::string_view bytes, std::size_t slots, std::int64_t n) {
  if (bytes.size() != slots * kNodeSlotBytes)
    throw PeerFailure("a malformed node share (" + std::to_string(bytes.size()) + " bytes, not " +
                      std::to_string(slots * kNodeSlotBytes) + ")");
  std::vector<NodeView> out;
  bool ended = false;
  for (std::size_t s = 0; s < slots; ++s) {
    const std::string_view slot = bytes.substr(s * kNodeSlotBytes, kNodeSlotBytes);
    std::int64_t index = 0;
    std::memcpy(&index, slot.data(), sizeof(index));
    if (index == -1) {
      if (slot.substr(8).find_first_not_of('\0') != std::string_view::npos)
        throw PeerFailure("a malformed node share: data in unused slot " + std::to_string(s));
      ended = true;
      continue;
    }
    if (ended || index < 0 || index >= n || (!out.empty() && index <= out.back().index))
      throw PeerFailure("a malformed node share: member index " + std::to_string(index) + " in slot " +
                        std::to_string(s) + " (ascending indices of a group of " + std::to_string(n) +
                        ", used slots first)");
    out.push_back({index, std::string(slot.substr(8))});
  }
  return out;
}

}  // namespace lmr::oob
