#include "lmr/oob/collective_ops.h"

#include <array>

namespace lmr::oob {

const std::vector<CollectiveOp>& collectiveOps() {
  static const std::vector<CollectiveOp> ops = {
      {"all_reduce", 1},
      {"broadcast", 2},
      {"reduce", 3},
      {"all_gather", 4},
      {"all_gather_into_tensor", 5},
      {"reduce_scatter", 6},
      {"reduce_scatter_tensor", 7},
      {"all_to_all", 8},
      {"all_to_all_single", 9},
      {"barrier", 10},
      {"gather", 11},
      {"scatter", 12},
      {"send", 13},
      {"recv", 14},
      {"isend", 15},
      {"irecv", 16},
      {"all_gather_object", 17},
      {"broadcast_object_list", 18},
      {"gather_object", 19},
      {"scatter_object_list", 20},
      {"monitored_barrier", 21},
      {"all_gather_single", 22},      // FSDP2's all-gather
      {"reduce_scatter_single", 23},  // FSDP2's reduce-scatter
  };
  return ops;
}

std::uint32_t fingerprintDigest(std::string_view text) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : text) crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace lmr::oob
