// Logging for liblmr: LMR_LOG(level, area, ...) writes one line to stderr when `level` is
// enabled. The threshold comes from the LMR_LOG_LEVEL environment variable (error, warn,
// info, debug; default warn), read once. Arguments are formatted only when the level is
// enabled. The library never writes to stdout. Thread-safe: each line is written whole.
#pragma once

#include <sstream>
#include <string_view>

namespace lmr::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool enabled(Level level) noexcept;
void write(Level level, std::string_view area, std::string_view message) noexcept;
// Parses "error|warn|info|debug" (case-insensitive); returns false when unknown.
bool parseLevel(std::string_view text, Level* out) noexcept;

template <typename... Args>
void logf(Level level, std::string_view area, const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  write(level, area, os.str());
}

}  // namespace lmr::log

#define LMR_LOG(level, area, ...)                                              \
  do {                                                                         \
    if (::lmr::log::enabled(::lmr::log::Level::level))                         \
      ::lmr::log::logf(::lmr::log::Level::level, (area), __VA_ARGS__);        \
  } while (0)
