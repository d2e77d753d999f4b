// lmr: the LM Resiliency command line.
//   lmr version
//   lmr c3 exact  [--ranks R0,R1,...] HEX...      exact consensus over hex evidence
//   lmr c3 timing [--ranks ...] [--kappa K] [--scale-floor S] [--absolute S] [--relative F]
//                 [--min-peers N] SECONDS...       robust timing consensus
//   lmr campaign validate|show|compare ...         fault-injection campaigns (campaign_cmd.cc)
//   lmr health probe|watch ...                     GPU health from NVML (health_cmd.cc); exit 1 on a fatal event
//   lmr ckpt inspect [--format text|json] DIR      a trust manifest's checkpoints and last decision (ckpt_cmd.cc)
// c3 prints JSON on stdout; exit status 0 Agree, 1 Attributed, 3 Inconclusive. campaign
// validate/show exit 0; compare exits 0 only when every occurrence is localized, else 1.
// Usage and input errors exit 2 with the message on stderr; other failures exit 4.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "lmr/common/error.h"
#include "lmr/common/hex.h"
#include "lmr/common/list.h"
#include "lmr/consensus/consensus.h"
#include "lmr/consensus/json.h"
#include "lmr/signature/signature.h"

namespace {

constexpr const char* kUsage =
    "usage: lmr version\n"
    "       lmr c3 exact  [--ranks R0,R1,...] HEX...\n"
    "       lmr c3 timing [--ranks R0,R1,...] [--kappa K] [--scale-floor S] [--absolute S]\n"
    "                     [--relative F] [--min-peers N] SECONDS...\n";

std::string usage() {
  return std::string(kUsage) + lmr::cli::kCampaignUsage + lmr::cli::kHealthUsage + lmr::cli::kCkptUsage;
}

double parseNumber(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size())
    throw lmr::InvalidArgument(what + ": not a number: '" + text + "'");
  return value;
}

std::int64_t parseInteger(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size())
    throw lmr::InvalidArgument(what + ": not an integer: '" + text + "'");
  return value;
}

int exitCode(lmr::consensus::Status status) {
  switch (status) {
    case lmr::consensus::Status::kAgree: return 0;
    case lmr::consensus::Status::kAttributed: return 1;
    case lmr::consensus::Status::kInconclusive: return 3;
  }
  return 3;
}

int runC3(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "exact" && args[0] != "timing"))
    throw lmr::InvalidArgument("c3 needs 'exact' or 'timing'");
  const bool exact = args[0] == "exact";
  std::vector<std::int64_t> ranks;
  lmr::consensus::TimingOptions options;
  std::vector<std::string> values;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw lmr::InvalidArgument(a + " needs a value");
      return args[++i];
    };
    if (a == "--ranks") ranks = lmr::parseIntegerList(next(), "--ranks");
    else if (!exact && a == "--kappa") options.kappa = parseNumber(next(), a);
    else if (!exact && a == "--scale-floor") options.scale_floor = parseNumber(next(), a);
    else if (!exact && a == "--absolute") options.absolute_threshold = parseNumber(next(), a);
    else if (!exact && a == "--relative") options.relative_threshold = parseNumber(next(), a);
    else if (!exact && a == "--min-peers") options.min_peers = static_cast<std::size_t>(parseInteger(next(), a));
    else if (a.rfind("--", 0) == 0) throw lmr::InvalidArgument("unknown option " + a);
    else values.push_back(a);
  }
  nlohmann::json out;
  lmr::consensus::Status status;
  if (exact) {
    std::vector<std::string> evidence;
    for (const std::string& v : values) evidence.push_back(lmr::fromHex(v));
    auto result = lmr::consensus::exact(evidence, ranks);
    out = lmr::consensus::toJson(result);
    status = result.status;
  } else {
    std::vector<double> seconds;
    for (const std::string& v : values) seconds.push_back(parseNumber(v, "timing"));
    auto result = lmr::consensus::timing(seconds, options, ranks);
    out = lmr::consensus::toJson(result);
    status = result.status;
  }
  std::cout << out.dump(2) << '\n';
  return exitCode(status);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
      std::cout << usage();
      return args.empty() ? 2 : 0;
    }
    if (args[0] == "version" || args[0] == "--version") {
      std::string kernels = "not built";
#if defined(LMR_WITH_CUDA)
      kernels = std::string("built for sm ") + LMR_CUDA_ARCHS + ", " +
                (lmr::signature::cudaAvailable() ? "device visible" : "no device visible: host path");
#endif
      std::cout << "lmr " << LMR_VERSION << " (CUDA kernels: " << kernels << ")\n";
      return 0;
    }
    if (args[0] == "c3") return runC3(std::vector<std::string>(args.begin() + 1, args.end()));
    if (args[0] == "campaign") return lmr::cli::runCampaign(std::vector<std::string>(args.begin() + 1, args.end()));
    if (args[0] == "ckpt") return lmr::cli::runCkpt(std::vector<std::string>(args.begin() + 1, args.end()));
    if (args[0] == "health") return lmr::cli::runHealth(std::vector<std::string>(args.begin() + 1, args.end()));
    throw lmr::InvalidArgument("unknown command '" + args[0] + "'");
  } catch (const lmr::InvalidArgument& e) {
    std::cerr << "lmr: error: " << e.message() << '\n';
    return 2;
  } catch (const lmr::Error& e) {
    std::cerr << "lmr: " << lmr::errorKindName(e.kind()) << ": " << e.what() << '\n';
    return 4;
  }
}
