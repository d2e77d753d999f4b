// Comma-separated lists on a command line: `lmr c3 --ranks 10,11,12`,
// `lmr-oobd --group-ranks=0,1,2,3`. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace lmr {

// The items of `text` between commas, in order and untrimmed. "" is one empty item, "1,,2"
// has an empty item in the middle, "1," ends with one and ",1" starts with one.
std::vector<std::string> splitCommaList(std::string_view text);

// The base-10 integers of a comma-separated list. An item is read as strtoll reads it
// (leading whitespace and a sign are allowed, out-of-range values saturate) and must be read
// to its end. Throws InvalidArgument naming `what` and the item:
//   "<what>: not an integer: '<item>'" for an empty item ("", "1,,2", "1,") or one with
//   anything besides the number ("1x", "1 ", "1.5");
//   "<what>: must be at least <min>: '<item>'" for a number below `min`.
std::vector<std::int64_t> parseIntegerList(std::string_view text, std::string_view what,
                                           std::int64_t min = std::numeric_limits<std::int64_t>::min());

}  // namespace lmr
