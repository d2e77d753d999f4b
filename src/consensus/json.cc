#include "lmr/consensus/json.h"

#include <string>

namespace lmr::consensus {
namespace {

std::string toHex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

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
