#include "lmr/common/log.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace lmr::log {
namespace {

Level thresholdFromEnv() {
  Level level = Level::kWarn;
  if (const char* text = std::getenv("LMR_LOG_LEVEL"); text != nullptr) parseLevel(text, &level);
  return level;
}

const char* levelName(Level level) {
  switch (level) {
    case Level::kError: return "E";
    case Level::kWarn: return "W";
    case Level::kInfo: return "I";
    case Level::kDebug: return "D";
  }
  return "?";
}

}  // namespace

bool parseLevel(std::string_view text, Level* out) noexcept {
  std::string lower;
  for (char c : text) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower == "error") *out = Level::kError;
  else if (lower == "warn" || lower == "warning") *out = Level::kWarn;
  else if (lower == "info") *out = Level::kInfo;
  else if (lower == "debug") *out = Level::kDebug;
  else return false;
  return true;
}

bool enabled(Level level) noexcept {
  static const Level threshold = thresholdFromEnv();
  return static_cast<int>(level) <= static_cast<int>(threshold);
}

void write(Level level, std::string_view area, std::string_view message) noexcept {
  std::string line = "[lmr ";
  line += levelName(level);
  line += ' ';
  line += area;
  line += "] ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace lmr::log
