// What the fabric says about this host's links: RDMA NIC port state and error counters
// read from sysfs (/sys/class/infiniband/<nic>/ports/<n>/{state,counters/*}). A NIC is
// degraded while one of its ports is not ACTIVE, or when one of its error counters grew
// since the previous poll (the first poll only records them). Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace lmr::mesh {

struct FabricReading {
  std::string kind;  // "nic" here; "switch" from other sources
  std::string name;
  bool degraded = false;
  std::string detail;  // "port 1 symbol_error +12; port 2 1: DOWN"
};

class InfinibandCounters {
 public:
  // `nics`: the NICs under `root` to read (empty: all). Unsupported when there are none.
  explicit InfinibandCounters(std::string root = "/sys/class/infiniband", std::vector<std::string> nics = {});
  // One reading per NIC, in name order. IoError when a port's state cannot be read.
  std::vector<FabricReading> poll();
  const std::vector<std::string>& nics() const { return nics_; }

  // The error counters read (a driver may lack some; those are skipped).
  static const std::vector<std::string>& errorCounters();

 private:
  std::string root_;
  std::vector<std::string> nics_;
  std::map<std::tuple<std::string, std::string, std::string>, std::int64_t> last_;  // (nic, port, counter)
};

}  // namespace lmr::mesh
