#include "lmr/common/keyed_hash.h"

#include "lmr/common/sha256.h"

namespace lmr {

std::uint64_t keyedHash(Int128 seed, std::string_view domain, std::initializer_list<std::string_view> ids,
                        std::int64_t iteration) {
  Sha256 h;
  h.update("lmr.keyed.v1");
  h.updateU64(domain.size()).update(domain);
  const auto bits = static_cast<unsigned __int128>(seed);
  h.updateU64(static_cast<std::uint64_t>(bits)).updateU64(static_cast<std::uint64_t>(bits >> 64));
  for (std::string_view id : ids) h.updateU64(id.size()).update(id);
  h.updateU64(static_cast<std::uint64_t>(iteration));
  const auto digest = h.finish();
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | digest[i];
  return v;
}

double keyedUniform(Int128 seed, std::string_view domain, std::initializer_list<std::string_view> ids,
                    std::int64_t iteration) {
  return static_cast<double>(keyedHash(seed, domain, ids, iteration) >> 11) * 0x1.0p-53;
}

}  // namespace lmr
