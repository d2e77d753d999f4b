// lmr ckpt inspect DIR: the checkpoints of a trust manifest, their states, steps and
// reasons, and the last recovery decision.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "lmr/ckpt/manifest.h"
#include "lmr/common/error.h"

namespace lmr::cli {

const char* const kCkptUsage = "       lmr ckpt inspect [--format text|json] DIR\n";

namespace {

void printText(const std::string& dir, const ckpt::Manifest& m) {
  std::cout << "trust manifest " << ckpt::manifestPath(dir) << "\n"
            << "topology " << (m.topology.empty() ? "(none)" : m.topology) << ", generation " << m.generation << ", "
            << (m.tainted_since ? "TAINTED by SDC at step " + std::to_string(*m.tainted_since) : "not tainted")
            << "\n\n";
  std::printf("%-16s %8s  %-8s %-18s %s\n", "checkpoint", "step", "tier", "state", "reason");
  for (const auto& c : m.checkpoints)
    std::printf("%-16s %8lld  %-8s %-18s %s\n", c.id.c_str(), static_cast<long long>(c.step),
                std::string(ckpt::name(c.tier)).c_str(), std::string(ckpt::name(c.state)).c_str(), c.reason.c_str());
  if (m.checkpoints.empty()) std::cout << "(no checkpoints)\n";
  std::cout << "\nlast decision: ";
  if (!m.decision) {
    std::cout << "none\n";
    return;
  }
  const auto& d = *m.decision;
  std::cout << d.mode << " for " << d.failure << " at step " << d.decided_at << " (" << d.status << ")";
  if (d.action != "rollback") std::cout << ", " << d.action;
  std::cout << "\n";
  if (d.available) std::cout << "  resume from " << d.checkpoint_id << " (step " << d.step << ", " << d.source << ")\n";
  if (!d.blamed_hosts.empty()) {
    std::cout << "  blamed:";
    for (const auto& h : d.blamed_hosts) std::cout << " " << h;
    std::cout << "\n";
  }
  std::cout << "  " << d.reason << "\n";
  if (!m.history.empty()) {
    std::cout << "\nearlier decisions (" << m.history.size() << "):\n";
    for (const auto& e : m.history)
      std::cout << "  step " << e.decided_at << ": " << e.mode << " for " << e.failure << ", " << e.action << " ("
                << e.status << ")\n";
  }
}

}  // namespace

int runCkpt(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "inspect") throw InvalidArgument("ckpt needs 'inspect'");
  bool json = false;
  std::string dir;
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--format") {
      if (i + 1 >= args.size()) throw InvalidArgument("--format needs a value");
      const std::string& f = args[++i];
      if (f != "text" && f != "json") throw InvalidArgument("--format must be text or json, got '" + f + "'");
      json = f == "json";
    } else if (args[i].rfind("--", 0) == 0) {
      throw InvalidArgument("unknown option " + args[i]);
    } else if (dir.empty()) {
      dir = args[i];
    } else {
      throw InvalidArgument("ckpt inspect takes one directory");
    }
  }
  if (dir.empty()) throw InvalidArgument("ckpt inspect needs a directory");
  const auto manifest = ckpt::readManifest(dir);
  if (!manifest) throw InvalidArgument("no trust manifest in " + dir + " (expected " + ckpt::manifestPath(dir) + ")");
  if (json) std::cout << ckpt::toJson(*manifest) << '\n';
  else printText(dir, *manifest);
  return 0;
}

}  // namespace lmr::cli
