// SHA-256 (FIPS 180-4), for identities that must be stable and tamper-evident: manifest
// identities, the keyed selection hash. Not for bulk data (see lmr/signature).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lmr {

class Sha256 {
 public:
  Sha256();
  Sha256& update(std::string_view bytes);
  Sha256& updateU64(std::uint64_t v);  // 8 bytes, little-endian
  std::array<std::uint8_t, 32> finish();

 private:
  void block(const std::uint8_t* p);
  std::uint32_t h_[8];
  std::uint8_t buffer_[64];
  std::size_t buffered_ = 0;
  std::uint64_t length_ = 0;
};

// Lowercase hex of the SHA-256 of `bytes`.
std::string sha256Hex(std::string_view bytes);

}  // namespace lmr
