// JSON form of consensus results (for the CLI and reports). Keys are the constants below.
#pragma once

#include <nlohmann/json.hpp>

#include "lmr/consensus/consensus.h"

namespace lmr::consensus {

inline constexpr const char* kKeyStatus = "status";
inline constexpr const char* kKeyBitmap = "bitmap";
inline constexpr const char* kKeyEvidence = "evidence";
inline constexpr const char* kKeyPeerRanks = "peer_ranks";
inline constexpr const char* kKeyAttributedRanks = "attributed_ranks";
inline constexpr const char* kKeyMajorityCount = "majority_count";
inline constexpr const char* kKeyMedian = "median";
inline constexpr const char* kKeyMad = "mad";
inline constexpr const char* kKeyScale = "scale";

// Exact evidence is written as lowercase hex.
nlohmann::json toJson(const ExactResult& result);
nlohmann::json toJson(const TimingResult& result);

}  // namespace lmr::consensus
