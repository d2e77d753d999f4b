// Logging for liblmr: LMR_LOG(level, area, ...) writes one line to stderr when `level` is
// enabled. The threshold comes from the LMR_LOG_LEVEL environment variable (error, warn,
// info, debug; default warn), read once. Arguments (strings, characters, booleans and
// numbers) are formatted only when the level is enabled. The library never writes to
// stdout. Thread-safe: each line is written whole.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

namespace lmr::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool enabled(Level level) noexcept;
void write(Level level, std::string_view area, std::string_view message) noexcept;
// Parses "error|warn|info|debug" (case-insensitive); returns false when unknown.
bool parseLevel(std::string_view text, Level* out) noexcept;

// Appends text and numbers without iostreams: a number formatted through std::ostream
// inside the Python module crashed in a process that had loaded torch first (seen on the
// accelerator machine), and logging must be safe anywhere.
inline void append(std::string& out, std::string_view text) { out.append(text); }
inline void append(std::string& out, const char* text) { out.append(text); }
inline void append(std::string& out, const std::string& text) { out.append(text); }
inline void append(std::string& out, bool value) { out.append(value ? "true" : "false"); }
inline void append(std::string& out, char value) { out.push_back(value); }
template <typename T,
          std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>, int> = 0>
void append(std::string& out, T value) {
  out.append(std::to_string(value));
}
template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
void append(std::string& out, T value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(value));
  out.append(text);
}

template <typename... Args>
void logf(Level level, std::string_view area, const Args&... args) {
  std::string message;
  (append(message, args), ...);
  write(level, area, message);
}

}  // namespace lmr::log

#define LMR_LOG(level, area, ...)                                      \
  do {                                                                 \
    if (::lmr::log::enabled(::lmr::log::Level::level))                 \
      ::lmr::log::logf(::lmr::log::Level::level, (area), __VA_ARGS__); \
  } while (0)
