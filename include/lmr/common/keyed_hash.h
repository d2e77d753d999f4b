// The one keyed hash behind every random choice the engine makes (probabilistic campaign
// selection, fault randomness): a pure function of (seed, domain, ids, iteration), so the
// same inputs give the same choice on every rank, run and machine. Never a global RNG.
//
// Definition (stable; changing it changes which occurrences a manifest selects):
//   SHA-256( "lmr.keyed.v1" || u64(len(domain)) || domain
//            || seed as 16 bytes little-endian two's complement
//            || for each id: u64(len(id)) || id
//            || u64(iteration) )           all u64 little-endian
// and the value is the first 8 bytes of the digest read little-endian.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace lmr {

using Int128 = __int128;

std::uint64_t keyedHash(Int128 seed, std::string_view domain, std::initializer_list<std::string_view> ids,
                        std::int64_t iteration);

// keyedHash mapped to a double uniform in [0, 1) (its top 53 bits).
double keyedUniform(Int128 seed, std::string_view domain, std::initializer_list<std::string_view> ids,
                    std::int64_t iteration);

}  // namespace lmr
