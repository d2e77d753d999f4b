// Private: enumerations of lmr::ckpt read back from their names (name() in the headers).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "lmr/common/files.h"
#include "lmr/common/json.h"

namespace lmr::ckpt::detail {

template <typename E, std::size_t N>
std::optional<E> fromName(std::string_view text, const E (&values)[N]) {
  for (E v : values)
    if (name(v) == text) return v;
  return std::nullopt;
}

// "a, b or c", for messages.
template <typename E, std::size_t N>
std::string namesOf(const E (&values)[N]) {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) out += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(name(values[i]));
  return out;
}

// The enumeration value a JSON string names; the error names the path and the accepted values.
template <typename E, std::size_t N>
E parseName(const json::Json& value, const std::string& path, const E (&values)[N]) {
  const std::string text = json::asString(value, path);
  if (auto v = fromName(text, values)) return *v;
  json::fail(path, "unknown value \"" + text + "\" (expected " + namesOf(values) + ")");
}

// Writes one of lmr::ckpt's JSON documents (the trust manifest, the exclusion ledger) as
// `path` in `directory`: complete or absent (files::replaceFile), temporaries of killed
// writers removed.
inline void writeDocument(const std::string& directory, const std::string& path, const std::string& text) {
  files::makeDirectories(directory);
  files::replaceFile(path, text + "\n");
  files::removeStaleTemporaries(path);
}

}  // namespace lmr::ckpt::detail
