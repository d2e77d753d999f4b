// Lowercase hexadecimal text for byte strings (digests in JSON, CLI arguments).
#pragma once

#include <string>
#include <string_view>

namespace lmr {

std::string toHex(std::string_view bytes);

// Parses an even number of hex digits (either case); throws InvalidArgument naming `text`.
std::string fromHex(std::string_view text);

}  // namespace lmr
