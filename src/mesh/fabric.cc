#include "lmr/mesh/fabric.h"

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "lmr/common/error.h"
#include "lmr/common/files.h"

namespace lmr::mesh {
namespace fs = std::filesystem;
namespace {

bool readLine(const fs::path& path, std::string& out) {
  const std::optional<std::string> text = files::readFile(path.string());
  if (!text) return false;
  out = text->substr(0, text->find('\n'));
  while (!out.empty() && (out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return true;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

const std::vector<std::string>& InfinibandCounters::errorCounters() {
  static const std::vector<std::string> names = {"symbol_error",
                                                 "link_error_recovery",
                                                 "link_downed",
                                                 "port_rcv_errors",
                                                 "port_rcv_remote_physical_errors",
                                                 "port_xmit_discards",
                                                 "local_link_integrity_errors",
                                                 "excessive_buffer_overrun_errors"};
  return names;
}

InfinibandCounters::InfinibandCounters(std::string root, std::vector<std::string> nics) : root_(std::move(root)) {
  for (const std::string& n : entries(root_))
    if (nics.empty() || std::find(nics.begin(), nics.end(), n) != nics.end()) nics_.push_back(n);
  if (nics_.empty()) throw Unsupported("no RDMA NICs to read under " + root_);
}

std::vector<FabricReading> InfinibandCounters::poll() {
  std::vector<FabricReading> out;
  for (const std::string& nic : nics_) {
    std::vector<std::string> problems;
    const fs::path ports = fs::path(root_) / nic / "ports";
    for (const std::string& port : entries(ports)) {
      std::string state;
      if (!readLine(ports / port / "state", state)) throw IoError("cannot read " + (ports / port / "state").string());
      if (state.size() < 6 || state.compare(state.size() - 6, 6, "ACTIVE") != 0)
        problems.push_back("port " + port + " " + state);
      for (const std::string& name : errorCounters()) {
        std::string text;
        if (!readLine(ports / port / "counters" / name, text)) continue;  // not every driver has every counter
        std::int64_t value = 0;
        const auto parsed = std::from_chars(text.data(), text.data() + text.size(), value);
        if (parsed.ec != std::errc()) continue;
        const auto key = std::make_tuple(nic, port, name);
        const auto before = last_.find(key);
        if (before != last_.end() && value > before->second)
          problems.push_back("port " + port + " " + name + " +" + std::to_string(value - before->second));
        last_[key] = value;
      }
    }
    std::string detail;
    for (const std::string& p : problems) detail += (detail.empty() ? "" : "; ") + p;
    out.push_back(FabricReading{"nic", nic, !problems.empty(), detail});
  }
  return out;
}

}  // namespace lmr::mesh
