#include "lmr/common/hex.h"

#include "lmr/common/error.h"

namespace lmr {
namespace {

int digitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string toHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string fromHex(std::string_view text) {
  if (text.size() % 2 != 0) throw InvalidArgument("'" + std::string(text) + "' has an odd number of hex digits");
  std::string out;
  out.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2) {
    const int hi = digitValue(text[i]);
    const int lo = digitValue(text[i + 1]);
    if (hi < 0 || lo < 0) throw InvalidArgument("'" + std::string(text) + "' is not hex");
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

}  // namespace lmr
