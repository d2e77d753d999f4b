#include "lmr/common/json.h"

#include <cmath>
#include <limits>
#include <vector>

#include "lmr/common/error.h"

namespace lmr::json {
namespace {

bool isIdentifierKey(std::string_view key) {
  if (key.empty()) return false;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

bool isIntegerLiteral(std::string_view text) {
  std::size_t i = (!text.empty() && text[0] == '-') ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return false;
  return true;
}

// Builds the DOM while enforcing the rules nlohmann's own DOM builder does not.
class StrictBuilder {
 public:
  explicit StrictBuilder(Document& doc) : doc_(doc) {}

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t& text) {
    if (isIntegerLiteral(text)) {
      doc_.big_integers[currentPath()] = text;
    } else if (!std::isfinite(v)) {
      return failAt(currentPath(), "number " + text + " does not fit a finite double");
    }
    return put(Json(v));
  }
  bool string(Json::string_t& v) { return put(Json(std::move(v))); }
  bool binary(Json::binary_t&) { return failAt(currentPath(), "binary values are not JSON"); }
  bool start_object(std::size_t) {
    Json* at = place(Json::object());
    stack_.push_back(Frame{at, currentPath(), ""});
    return true;
  }
  bool key(Json::string_t& k) {
    Frame& f = stack_.back();
    if (f.value->contains(k)) return failAt(child(f.path, k), "duplicate key");
    f.key = k;
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    Json* at = place(Json::array());
    stack_.push_back(Frame{at, currentPath(), ""});
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    std::string what = e.what();
    // nlohmann's message starts with "[json.exception.parse_error.101] parse error at line ..."
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    error_ = "byte " + std::to_string(position) + ": " + what;
    return false;
  }

  const std::string& error() const { return error_; }
  const std::string& errorPath() const { return error_path_; }
  bool hasPathError() const { return has_path_error_; }

 private:
  struct Frame {
    Json* value;
    std::string path;
    std::string key;
  };

  std::string currentPath() const {
    if (stack_.empty()) return "";
    const Frame& f = stack_.back();
    if (f.value->is_object()) return child(f.path, f.key);
    return item(f.path, f.value->size());
  }

  Json* place(Json v) {
    if (stack_.empty()) {
      doc_.value = std::move(v);
      return &doc_.value;
    }
    Frame& f = stack_.back();
    if (f.value->is_object()) return &((*f.value)[f.key] = std::move(v));
    f.value->push_back(std::move(v));
    return &f.value->back();
  }

  bool put(Json v) {
    place(std::move(v));
    return true;
  }

  bool failAt(const std::string& path, const std::string& message) {
    has_path_error_ = true;
    error_path_ = path;
    error_ = message;
    return false;
  }

  Document& doc_;
  std::vector<Frame> stack_;
  std::string error_;
  std::string error_path_;
  bool has_path_error_ = false;
};

}  // namespace

std::string child(const std::string& path, std::string_view key) {
  if (isIdentifierKey(key)) return path.empty() ? std::string(key) : path + "." + std::string(key);
  return path + "[" + Json(std::string(key)).dump() + "]";
}

std::string item(const std::string& path, std::size_t index) { return path + "[" + std::to_string(index) + "]"; }

std::string where(const std::string& path) { return path.empty() ? "(document)" : path; }

void fail(const std::string& path, std::string_view message) {
  throw InvalidArgument(where(path) + ": " + std::string(message));
}

Document parse(std::string_view text, std::string_view source) {
  Document doc;
  StrictBuilder builder(doc);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &builder, Json::input_format_t::json, true);
  } catch (const Json::exception& e) {
    throw InvalidArgument(std::string(source) + ": " + e.what());
  }
  if (!ok) {
    if (builder.hasPathError()) fail(builder.errorPath(), builder.error());
    throw InvalidArgument(std::string(source) + ": " + builder.error());
  }
  try {
    (void)doc.value.dump();  // strings must be valid UTF-8
  } catch (const Json::type_error&) {
    throw InvalidArgument(std::string(source) + ": a string is not valid UTF-8");
  }
  return doc;
}

std::string describe(const Json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

void requireObject(const Json& value, const std::string& path) {
  if (!value.is_object()) fail(path, "must be an object, got " + describe(value));
}

void requireKnownKeys(const Json& object, const std::string& path, std::initializer_list<std::string_view> allowed) {
  requireObject(object, path);
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || a == key;
    if (!known) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      fail(child(path, key), "unknown field (allowed: " + list + ")");
    }
  }
}

const Json* findMember(const Json& object, std::string_view key) {
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

const Json& requireMember(const Json& object, const std::string& path, std::string_view key) {
  const Json* v = findMember(object, key);
  if (v == nullptr) fail(child(path, key), "required field is missing");
  return *v;
}

std::int64_t asInteger(const Json& v, const std::string& path) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) fail(path, "integer out of range");
    return static_cast<std::int64_t>(u);
  }
  fail(path, "must be a JSON integer, got " + describe(v));
}

std::int64_t asPositiveInteger(const Json& v, const std::string& path) {
  const std::int64_t x = asInteger(v, path);
  if (x <= 0) fail(path, "must be a positive integer, got " + describe(v));
  return x;
}

std::int64_t asNonNegativeInteger(const Json& v, const std::string& path) {
  const std::int64_t x = asInteger(v, path);
  if (x < 0) fail(path, "must be a non-negative integer, got " + describe(v));
  return x;
}

double asNumber(const Json& v, const std::string& path) {
  if (!v.is_number()) fail(path, "must be a number, got " + describe(v));
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(path, "must be finite");
  return x;
}

bool asBoolean(const Json& v, const std::string& path) {
  if (!v.is_boolean()) fail(path, "must be a JSON boolean, got " + describe(v));
  return v.get<bool>();
}

std::string asString(const Json& v, const std::string& path) {
  if (!v.is_string()) fail(path, "must be a string, got " + describe(v));
  return v.get<std::string>();
}

std::string asIdentifier(const Json& v, const std::string& path) {
  std::string s = asString(v, path);
  if (s.find_first_not_of(" \t\r\n") == std::string::npos) fail(path, "must be a non-empty string");
  return s;
}

std::string canonical(const Json& value) { return value.dump(); }  // std::map keeps keys sorted

std::string int128ToString(Int128 value) {
  if (value == 0) return "0";
  const bool negative = value < 0;
  unsigned __int128 magnitude =
      negative ? -static_cast<unsigned __int128>(value) : static_cast<unsigned __int128>(value);
  std::string digits;
  while (magnitude > 0) {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(magnitude % 10)));
    magnitude /= 10;
  }
  return negative ? "-" + digits : digits;
}

std::optional<Int128> parseInt128(std::string_view text) {
  if (!isIntegerLiteral(text)) return std::nullopt;
  const bool negative = text[0] == '-';
  const unsigned __int128 limit =
      negative ? (static_cast<unsigned __int128>(1) << 127) : (static_cast<unsigned __int128>(1) << 127) - 1;
  unsigned __int128 magnitude = 0;
  for (std::size_t i = negative ? 1 : 0; i < text.size(); ++i) {
    const unsigned digit = static_cast<unsigned>(text[i] - '0');
    if (magnitude > (limit - digit) / 10) return std::nullopt;
    magnitude = magnitude * 10 + digit;
  }
  return negative ? static_cast<Int128>(-magnitude) : static_cast<Int128>(magnitude);
}

}  // namespace lmr::json

namespace lmr::json {

std::string dumpWithRawMember(Json object, const std::string& key, const std::string& raw, int indent) {
  object[key] = nullptr;
  const std::string text = object.dump(indent);
  const std::string quoted = Json(key).dump();
  // Find the member at depth 1: scan outside strings, counting braces and brackets.
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
    else if (c == '"') {
      if (depth == 1 && text.compare(i, quoted.size(), quoted) == 0 && text.compare(i + quoted.size(), 1, ":") == 0) {
        std::size_t value = i + quoted.size() + 1;
        while (value < text.size() && text[value] == ' ') ++value;
        std::string inserted = raw;
        if (indent >= 0) {
          std::string pad = "\n" + std::string(static_cast<std::size_t>(indent), ' ');
          for (std::size_t at = inserted.find('\n'); at != std::string::npos; at = inserted.find('\n', at + pad.size()))
            inserted.replace(at, 1, pad);
        }
        return text.substr(0, value) + inserted + text.substr(value + 4);  // 4 == strlen("null")
      }
      in_string = true;
    }
  }
  throw InvalidArgument("dumpWithRawMember: no top-level member \"" + key + "\"");
}

}  // namespace lmr::json
