// Validation of the built-in local executor's parameters, so a bad value fails when the
// manifest is read, never later inside a training hook.
#include <string>
#include <vector>

#include "lmr/campaign/manifest.h"

namespace lmr::campaign {
namespace {

using json::child;
using json::fail;
using json::findMember;

constexpr std::string_view kOperations[] = {"single_bitflip", "multi_bitflip", "set_value",
                                            "scale",          "noise",         "sign_flip"};
constexpr std::string_view kScopes[] = {"single", "row", "1%", "10%", "100%"};
// Where a gradient fault lands: this rank's own gradient before any reduction (the default),
// or its reduced gradient (or shard) just before the optimizer step.
constexpr std::string_view kGradientPoints[] = {"local", "reduced"};
constexpr std::string_view kMagnitudes[] = {"catastrophic", "large", "medium", "subtle", "near_invisible"};
// The longest wait a platform timer takes (Python's threading.TIMEOUT_MAX on Linux), in ms.
constexpr double kMaxDelayMs = 9223372036.0 * 1000.0;

std::string join(const auto& list) {
  std::string out;
  for (std::string_view s : list) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

std::string enumValue(const Json& v, const std::string& path, const auto& allowed) {
  const std::string s = json::asString(v, path);
  for (std::string_view a : allowed)
    if (a == s) return s;
  fail(path, "unknown value \"" + s + "\" (allowed: " + join(allowed) + ")");
}

}  // namespace

void validateBuiltInParameters(const Fault& fault, const std::string& path) {
  const Json& p = fault.parameters;
  const Surface surface = fault.target.surface;
  const bool parameter_surface = isParameterSurface(surface);

  // Which keys this (type, operation, surface) accepts.
  std::vector<std::string_view> allowed;
  std::string operation;
  switch (fault.type) {
    case FailureType::kTensorCorruption: {
      const Json* op = findMember(p, "operation");
      if (op == nullptr)
        fail(child(path, "operation"), "required for tensor_corruption (allowed: " + join(kOperations) + ")");
      operation = enumValue(*op, child(path, "operation"), kOperations);
      allowed = {"operation", "scope"};
      if (operation == "single_bitflip" || operation == "multi_bitflip" || operation == "scale" ||
          operation == "noise") {
        allowed.push_back("magnitude");
      }
      if (operation == "set_value") allowed.push_back("value");
      if (operation == "scale") allowed.push_back("factor");
      if (operation == "noise") allowed.push_back("std");
      break;
    }
    case FailureType::kStaleState:
    case FailureType::kDuplicate:
    case FailureType::kDrop: allowed = {"scope"}; break;
    case FailureType::kReorder: break;  // always the full leading dimension: no scope
    case FailureType::kDelay: allowed = {"delay_ms"}; break;
    default: return;  // not a built-in effect
  }
  if (fault.type != FailureType::kDelay) {
    if (parameter_surface) allowed.push_back("parameter");
    if (surface == Surface::kOptimizerState) allowed.push_back("state_key");
    if (surface == Surface::kGradient) allowed.push_back("point");
  }

  for (const auto& [key, value] : p.items()) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || a == key;
    if (!ok) {
      std::string what = std::string(name(fault.type)) + (operation.empty() ? "" : " " + operation) + " on surface " +
                         std::string(name(surface));
      fail(child(path, key),
           "does not apply to " + what + " (accepted: " + (allowed.empty() ? "none" : join(allowed)) + ")");
    }
  }

  if (const Json* v = findMember(p, "scope")) enumValue(*v, child(path, "scope"), kScopes);
  if (const Json* v = findMember(p, "magnitude")) enumValue(*v, child(path, "magnitude"), kMagnitudes);
  if (const Json* v = findMember(p, "parameter")) json::asIdentifier(*v, child(path, "parameter"));
  if (const Json* v = findMember(p, "state_key")) json::asIdentifier(*v, child(path, "state_key"));
  if (const Json* v = findMember(p, "point")) enumValue(*v, child(path, "point"), kGradientPoints);
  if (operation == "set_value") {
    const Json* v = findMember(p, "value");
    if (v == nullptr) fail(child(path, "value"), "required for set_value (a number, \"nan\", \"inf\" or \"-inf\")");
    if (v->is_string()) {
      const std::string s = v->get<std::string>();
      if (s != "nan" && s != "inf" && s != "-inf")
        fail(child(path, "value"), "a string value must be \"nan\", \"inf\" or \"-inf\"");
    } else {
      json::asNumber(*v, child(path, "value"));
    }
  }
  if (const Json* v = findMember(p, "factor")) {
    if (json::asNumber(*v, child(path, "factor")) == 1.0) fail(child(path, "factor"), "1 would change nothing");
  }
  if (const Json* v = findMember(p, "std")) {
    if (json::asNumber(*v, child(path, "std")) <= 0.0) fail(child(path, "std"), "must be positive");
  }
  if (fault.type == FailureType::kDelay) {
    const Json* v = findMember(p, "delay_ms");
    if (v == nullptr) fail(child(path, "delay_ms"), "required for delay (milliseconds, a positive number)");
    const double ms = json::asNumber(*v, child(path, "delay_ms"));
    if (ms <= 0.0) fail(child(path, "delay_ms"), "must be positive");
    if (ms > kMaxDelayMs) fail(child(path, "delay_ms"), "exceeds the longest timer wait (about 292 years)");
  }
}

}  // namespace lmr::campaign
