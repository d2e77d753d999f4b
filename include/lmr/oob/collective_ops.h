// The operation codes and digests of CollectiveFingerprint (lmr/oob/progress.h): one name per
// public collective or point-to-point call a rank publishes, and the digest that turns a
// group's membership or fixed tensor metadata into a fingerprint field. Peers compare
// fingerprints, so every rank must use these same codes and this same digest.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace lmr::oob {

// The public torch.distributed-style calls, by name. Codes are stable (they are compared
// across ranks, never persisted).
struct CollectiveOp {
  std::string_view name;
  std::uint32_t code;
};
const std::vector<CollectiveOp>& collectiveOps();

// Collectives a framework runs outside the public calls (a DDP bucket all-reduce) are
// numbered by the framework's adapter from this code up.
inline constexpr std::uint32_t kFirstInternalCollectiveOp = 32;

// CRC-32 (IEEE 802.3, as zlib's crc32) of `text`: the digest of a group membership or of
// fixed tensor metadata in a fingerprint.
std::uint32_t fingerprintDigest(std::string_view text);

}  // namespace lmr::oob
