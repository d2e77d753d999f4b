// Helpers shared by the campaign tests.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "lmr/campaign/manifest.h"
#include "lmr/common/error.h"

namespace lmr::campaign::testing {

inline std::string readExample(const std::string& name) {
  std::ifstream in(std::string(LMR_SOURCE_DIR) + "/examples/campaigns/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A small valid manifest to mutate in tests.
inline json::Json baseManifest() {
  return json::Json::parse(R"({
    "name": "unit",
    "incidents": [{
      "incident_id": "sdc",
      "trigger": {"at": [10, 20]},
      "lifetime": {"matching_calls": 1},
      "faults": [{
        "fault_id": "out",
        "type": "tensor_corruption",
        "target": {"rank": 1, "component": "transformer_block", "index": 2, "surface": "output"},
        "parameters": {"operation": "single_bitflip"}
      }]
    }]
  })");
}

// The InvalidArgument message parsing `text` raises ("" when it parses).
inline std::string parseError(const std::string& text) {
  try {
    Campaign::parse(text);
    return "";
  } catch (const InvalidArgument& e) {
    return e.message();
  }
}

}  // namespace lmr::campaign::testing
