#include "lmr/common/list.h"

#include <cstdlib>

#include "lmr/common/error.h"

namespace lmr {

std::vector<std::string> splitCommaList(std::string_view text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    items.emplace_back(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return items;
    start = comma + 1;
  }
}

std::vector<std::int64_t> parseIntegerList(std::string_view text, std::string_view what, std::int64_t min) {
  std::vector<std::int64_t> values;
  for (const std::string& item : splitCommaList(text)) {
    char* end = nullptr;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || end != item.c_str() + item.size())
      throw InvalidArgument(std::string(what) + ": not an integer: '" + item + "'");
    if (value < min)
      throw InvalidArgument(std::string(what) + ": must be at least " + std::to_string(min) + ": '" + item + "'");
    values.push_back(value);
  }
  return values;
}

}  // namespace lmr
