// Strict JSON for manifests, journals and artifacts (nlohmann::json underneath).
//
// parse() accepts exactly one JSON value and rejects duplicate object keys, numbers that do
// not fit a finite double, and invalid UTF-8. Integers outside the 64-bit range keep their
// literal text (for 128-bit seeds). Every error is an InvalidArgument whose message starts
// with the JSON path of the offending value, e.g. "incidents[1].faults[0].target.rank: ...".
// The typed accessors below produce the same kind of message.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "lmr/common/keyed_hash.h"

namespace lmr::json {

using Json = nlohmann::json;

struct Document {
  Json value;
  // JSON path -> literal text, for integers that do not fit int64/uint64 (stored in `value`
  // as the nearest double).
  std::map<std::string, std::string> big_integers;
};

// `source` names the input in messages about syntax ("campaign.json: byte 17: ...").
Document parse(std::string_view text, std::string_view source = "JSON");

// Path composition: child("", "a") == "a", child("a", "b") == "a.b", item("a", 2) == "a[2]".
std::string child(const std::string& path, std::string_view key);
std::string item(const std::string& path, std::size_t index);
// How a path is named at the start of a message ("(document)" for the root).
std::string where(const std::string& path);

[[noreturn]] void fail(const std::string& path, std::string_view message);

// A short description of a value for messages: "true", "3.5", "\"abc\"", "an object".
std::string describe(const Json& value);

void requireObject(const Json& value, const std::string& path);
// Rejects keys not in `allowed`.
void requireKnownKeys(const Json& object, const std::string& path, std::initializer_list<std::string_view> allowed);
// The member `key` of `object`; fails with "<path>.<key>: required field is missing".
const Json& requireMember(const Json& object, const std::string& path, std::string_view key);
const Json* findMember(const Json& object, std::string_view key);  // nullptr when absent

// JSON integers only: no booleans, no 3.0, no strings. Range-checked.
std::int64_t asInteger(const Json& value, const std::string& path);
std::int64_t asPositiveInteger(const Json& value, const std::string& path);
std::int64_t asNonNegativeInteger(const Json& value, const std::string& path);
// A JSON number (integer or finite float), not a boolean.
double asNumber(const Json& value, const std::string& path);
bool asBoolean(const Json& value, const std::string& path);
std::string asString(const Json& value, const std::string& path);
// Non-empty and not only whitespace.
std::string asIdentifier(const Json& value, const std::string& path);

// Compact text with object keys in byte order: equal values give equal text.
std::string canonical(const Json& value);

std::string int128ToString(Int128 value);
// Decimal digits with optional '-'; nullopt when malformed or out of range.
std::optional<Int128> parseInt128(std::string_view text);

}  // namespace lmr::json

namespace lmr::json {

// Dumps `object` (indent < 0: compact) with the top-level member `key` written as the JSON
// text `raw` (which may hold numbers nlohmann cannot, such as 128-bit integers). `raw` is
// inserted verbatim; with an indent, its lines are indented to their depth.
std::string dumpWithRawMember(Json object, const std::string& key, const std::string& raw, int indent);

}  // namespace lmr::json
