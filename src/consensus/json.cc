#include "lmr/consensus/json.h"

#include <string>

#include "lmr/common/hex.h"

namespace lmr::consensus {
namespace {

template <typename Result>
nlohmann::json common(const Result& r) {
  nlohmann::json j;
  j[kKeyStatus] = std::string(statusName(r.status));
  j[kKeyBitmap] = r.bitmap;
  j[kKeyPeerRanks] = r.peer_ranks;
  j[kKeyAttributedRanks] = r.attributedRanks();
  return j;
}

}  // namespace

nlohmann::json toJson(const ExactResult& r) {
  nlohmann::json j = common(r);
  nlohmann::json evidence = nlohmann::json::array();
  for (const std::string& e : r.evidence) evidence.push_back(toHex(e));
  j[kKeyEvidence] = evidence;
  j[kKeyMajorityCount] = r.majority_count;
  return j;
}

nlohmann::json toJson(const TimingResult& r) {
  nlohmann::json j = common(r);
  j[kKeyEvidence] = r.evidence;
  j[kKeyMedian] = r.median;
  j[kKeyMad] = r.mad;
  j[kKeyScale] = r.scale;
  return j;
}

}  // namespace lmr::consensus
