// Private helper shared by the exact and timing deciders.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lmr::consensus::detail {

// Checks `given` (size n, no repeats, or empty for identity) and returns the mapping.
std::vector<std::int64_t> checkedPeerRanks(std::span<const std::int64_t> given, std::size_t n);

// Ranks of the set bits of `bitmap`.
std::vector<std::int64_t> ranksOf(const std::vector<bool>& bitmap, const std::vector<std::int64_t>& ranks);

}  // namespace lmr::consensus::detail
