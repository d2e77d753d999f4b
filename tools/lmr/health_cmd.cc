// lmr health probe|watch: GPU health readings and events from NVML.
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "lmr/common/error.h"
#include "lmr/health/monitor.h"
#include "lmr/health/nvml.h"

namespace lmr::cli {

const char* const kHealthUsage =
    "       lmr health probe [--format text|json] [--device N]... [--library PATH]\n"
    "       lmr health watch [--interval S] [--count N] [--format text|json] [--device N]... [--library PATH]\n";

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void onSignal(int) { g_interrupted = 1; }

struct HealthArgs {
  bool json = false;
  double interval_s = 5;
  long count = 0;  // watch: stop after this many polls (0: until interrupted)
  std::vector<unsigned> devices;
  health::NvmlOptions nvml;
};

HealthArgs parse(const std::vector<std::string>& args, bool watch) {
  HealthArgs out;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw InvalidArgument(a + " needs a value");
      return args[++i];
    };
    auto number = [&](const std::string& text) {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0') throw InvalidArgument(a + ": not a number: '" + text + "'");
      return v;
    };
    if (a == "--format") {
      const std::string& f = next();
      if (f != "text" && f != "json") throw InvalidArgument("--format must be text or json, got '" + f + "'");
      out.json = f == "json";
    } else if (a == "--device") {
      const double v = number(next());
      if (v < 0 || v != static_cast<unsigned>(v)) throw InvalidArgument("--device: not a device index");
      out.devices.push_back(static_cast<unsigned>(v));
    } else if (a == "--library") {
      out.nvml.library_path = next();
    } else if (watch && a == "--interval") {
      out.interval_s = number(next());
      if (!(out.interval_s > 0)) throw InvalidArgument("--interval must be > 0");
    } else if (watch && a == "--count") {
      const double v = number(next());
      if (v < 1 || v != static_cast<long>(v)) throw InvalidArgument("--count must be a positive integer");
      out.count = static_cast<long>(v);
    } else {
      throw InvalidArgument("unknown option " + a + " for health " + args[0]);
    }
  }
  if (out.devices.empty()) {
    const unsigned count = health::nvmlDeviceCount(out.nvml);
    for (unsigned i = 0; i < count; ++i) out.devices.push_back(i);
  }
  return out;
}

std::string valueText(double v) { return health::jsonValue(v).dump(); }

void printEventText(const health::Event& e) {
  std::cout << health::severityName(e.severity) << "  gpu " << e.device.index << " (" << e.device.uuid << ", "
            << e.device.pci_bus_id << ")  " << e.metric << "=" << valueText(e.value) << "  " << e.message << std::endl;
}

int probe(const HealthArgs& args) {
  health::Rules rules{health::MonitorOptions{}};
  nlohmann::json devices = nlohmann::json::array();
  bool fatal = false;
  for (unsigned index : args.devices) {
    health::NvmlOptions options = args.nvml;
    options.xid_events = false;  // one poll cannot see XIDs: they arrive as events over time
    std::unique_ptr<health::NvmlSource> opened;
    try {
      opened = std::make_unique<health::NvmlSource>(index, options);
    } catch (const IoError& e) {  // a GPU NVML lists but cannot open (lost before we started)
      fatal = true;
      devices.push_back({{"device", {{"index", index}}},
                         {"error", e.message()},
                         {"events", {{{"severity", "fatal"}, {"metric", "device_lost"}, {"message", e.message()}}}}});
      continue;
    }
    health::NvmlSource& source = *opened;
    const health::PollResult result = source.poll();
    const auto events = rules.evaluate(source.name(), result.readings, 0);
    nlohmann::json readings = nlohmann::json::object(), details = nlohmann::json::object();
    for (const auto& r : result.readings) {
      readings[r.metric] = health::jsonValue(r.value);
      if (!r.detail.empty()) details[r.metric] = r.detail;
    }
    nlohmann::json unsupported = nlohmann::json::array();
    for (const auto& u : result.unsupported) unsupported.push_back({{"metric", u.metric}, {"reason", u.reason}});
    nlohmann::json event_list = nlohmann::json::array();
    for (const auto& e : events) {
      fatal = fatal || e.severity == health::Severity::kFatal;
      nlohmann::json j = health::toJson(e);
      j.erase("time");
      event_list.push_back(j);
    }
    devices.push_back({{"device", health::toJson(source.device())},
                       {"readings", readings},
                       {"details", details},
                       {"unsupported", unsupported},
                       {"events", event_list}});
  }
  if (args.json) {
    std::cout << nlohmann::json{{"schema_version", 1}, {"type", "lmr.health_probe"}, {"devices", devices}}.dump(2)
              << '\n';
  } else {
    for (const auto& d : devices) {
      const auto& dev = d["device"];
      if (d.contains("error")) {
        std::cout << "gpu " << dev["index"].get<int>() << "  fatal: device_lost: " << d["error"].get<std::string>()
                  << '\n';
        continue;
      }
      std::cout << "gpu " << dev["index"].get<int>() << "  " << dev["name"].get<std::string>() << "  "
                << dev["uuid"].get<std::string>() << "  pci " << dev["pci_bus_id"].get<std::string>() << '\n';
      for (const auto& [metric, value] : d["readings"].items()) {
        std::cout << "  " << metric << std::string(metric.size() < 30 ? 30 - metric.size() : 1, ' ') << value.dump();
        if (d["details"].contains(metric)) std::cout << "  (" << d["details"][metric].get<std::string>() << ")";
        std::cout << '\n';
      }
      for (const auto& u : d["unsupported"])
        std::cout << "  unsupported: " << u["metric"].get<std::string>() << " (" << u["reason"].get<std::string>()
                  << ")\n";
      for (const auto& e : d["events"])
        std::cout << "  " << e["severity"].get<std::string>() << ": " << e["metric"].get<std::string>() << ": "
                  << e["message"].get<std::string>() << '\n';
    }
  }
  return fatal ? 1 : 0;
}

int watch(const HealthArgs& args) {
  std::vector<std::shared_ptr<health::Source>> sources;
  const bool json = args.json;
  bool fatal = false;
  for (unsigned index : args.devices) {
    try {
      sources.push_back(std::make_shared<health::NvmlSource>(index, args.nvml));
    } catch (const IoError& e) {  // cannot be opened: report it lost, watch the others
      fatal = true;
      if (json)
        std::cout << nlohmann::json{{"type", "lmr.health_event"},
                                    {"severity", "fatal"},
                                    {"metric", "device_lost"},
                                    {"device", {{"index", index}}},
                                    {"message", e.message()}}
                         .dump()
                  << std::endl;
      else std::cout << "fatal  gpu " << index << "  device_lost  " << e.message() << std::endl;
    }
  }
  if (sources.empty()) return 1;
  health::MonitorOptions options;
  options.interval_s = args.interval_s;
  std::mutex out_mutex;
  health::Monitor monitor(options, sources, [&](const health::Event& e) {
    std::lock_guard<std::mutex> lock(out_mutex);
    fatal = fatal || e.severity == health::Severity::kFatal;
    if (json) std::cout << health::toJson(e).dump() << std::endl;
    else printEventText(e);
  });
  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  std::cerr << "lmr health: watching " << sources.size() << " GPU(s) every " << args.interval_s << " s"
            << (args.count ? ", " + std::to_string(args.count) + " polls" : ", until interrupted") << std::endl;
  monitor.start();
  std::size_t errors_shown = 0;
  while (!g_interrupted && (args.count == 0 || monitor.polls() < static_cast<std::uint64_t>(args.count))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto errors = monitor.errors();
    for (; errors_shown < errors.size(); ++errors_shown)
      std::cerr << "lmr health: " << errors[errors_shown].source << ": " << errors[errors_shown].message << std::endl;
  }
  monitor.stop();
  std::lock_guard<std::mutex> lock(out_mutex);
  return fatal ? 1 : 0;
}

}  // namespace

int runHealth(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "probe" && args[0] != "watch"))
    throw InvalidArgument("health needs 'probe' or 'watch'");
  const bool is_watch = args[0] == "watch";
  const HealthArgs parsed = parse(args, is_watch);
  return is_watch ? watch(parsed) : probe(parsed);
}

}  // namespace lmr::cli
