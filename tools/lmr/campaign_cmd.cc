// lmr campaign validate FILE
// lmr campaign show FILE --until N [--origin-offset K]
// lmr campaign compare --injections FILE... --localization FILE [--exclusions DIR] [--format text|json]
//                      [--report FILE]
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "lmr/campaign/compare.h"
#include "lmr/campaign/schedule.h"
#include "lmr/ckpt/exclusion.h"
#include "lmr/common/error.h"

namespace lmr::cli {

const char* const kCampaignUsage =
    "       lmr campaign validate FILE\n"
    "       lmr campaign show FILE --until N [--origin-offset K]\n"
    "       lmr campaign compare --injections FILE... --localization FILE [--exclusions DIR] [--format text|json] "
    "[--report FILE]\n";

namespace {

using campaign::Campaign;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::int64_t parseCount(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
  }
  if (used != text.size() || v < 0) throw InvalidArgument(what + " needs a non-negative integer, got '" + text + "'");
  return v;
}

int validate(const std::vector<std::string>& args) {
  if (args.size() != 1) throw InvalidArgument("campaign validate takes one FILE");
  const Campaign c = Campaign::parse(readFile(args[0]), args[0]);
  std::cout << c.identity() << "\n";
  return 0;
}

int show(const std::vector<std::string>& args) {
  std::string file;
  std::int64_t until = -1, offset = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw InvalidArgument(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--until") until = parseCount(value(), "--until");
    else if (args[i] == "--origin-offset") offset = parseCount(value(), "--origin-offset");
    else if (file.empty() && args[i].rfind("--", 0) != 0) file = args[i];
    else throw InvalidArgument("unexpected argument '" + args[i] + "'");
  }
  if (file.empty() || until < 0) throw InvalidArgument("campaign show needs FILE and --until N");
  const Campaign c = Campaign::parse(readFile(file), file);
  std::cout << "campaign " << c.name() << "  " << c.identity() << "  (clock " << campaign::name(c.origin())
            << ", offset " << offset << ")\n";
  std::printf("%10s  %-36s %-9s %-13s %s\n", "iteration", "occurrence", "selected", "temporal", "actions");
  std::size_t selected = 0, skipped = 0;
  campaign::forEachCandidate(c, offset, 0, until, [&](const campaign::Candidate& cand) {
    const campaign::Incident& inc = c.incidents()[cand.incident];
    std::string actions;
    for (const auto& f : inc.faults) {
      if (!actions.empty()) actions += "; ";
      actions +=
          f.fault_id + " " + std::string(campaign::name(f.type)) + " " + std::string(campaign::name(f.target.surface));
      if (f.target.rank) actions += " rank " + std::to_string(*f.target.rank);
      if (f.target.resource) actions += " " + *f.target.resource;
    }
    std::printf("%10lld  %-36s %-9s %-13s %s\n", static_cast<long long>(cand.iteration),
                campaign::occurrenceId(inc.incident_id, cand.position).c_str(), cand.selected ? "yes" : "skipped",
                std::string(campaign::name(inc.temporalClass())).c_str(), actions.c_str());
    (cand.selected ? selected : skipped) += 1;
  });
  std::cout << selected << " selected, " << skipped << " skipped by probability, up to iteration " << until << "\n";
  return 0;
}

int compare(const std::vector<std::string>& args) {
  std::vector<std::string> injections;
  std::string localization, format = "text", report_path, exclusions;
  std::vector<std::string>* collecting = nullptr;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw InvalidArgument(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--injections") collecting = &injections;
    else if (args[i] == "--localization") {
      localization = value();
      collecting = nullptr;
    } else if (args[i] == "--format") {
      format = value();
      collecting = nullptr;
    } else if (args[i] == "--report") {
      report_path = value();
      collecting = nullptr;
    } else if (args[i] == "--exclusions") {
      exclusions = value();
      collecting = nullptr;
    } else if (collecting != nullptr && args[i].rfind("--", 0) != 0) collecting->push_back(args[i]);
    else throw InvalidArgument("unexpected argument '" + args[i] + "'");
  }
  if (injections.empty() || localization.empty())
    throw InvalidArgument("campaign compare needs --injections and --localization");
  if (format != "text" && format != "json") throw InvalidArgument("--format must be text or json");
  std::vector<campaign::InjectionArtifact> artifacts;
  for (const std::string& f : injections) artifacts.push_back(campaign::InjectionArtifact::parse(readFile(f), f));
  const auto results = campaign::parseLocalizationArtifact(readFile(localization), localization);
  campaign::CampaignReport report = campaign::compareArtifacts(artifacts, results);
  if (!exclusions.empty()) {  // the nodes the job excluded, from its exclusion ledger
    std::vector<std::string> hosts;
    for (const auto& e : ckpt::readLedger(exclusions).excluded) hosts.push_back(e.host);
    campaign::scoreExclusions(report, hosts);
  }
  if (!report_path.empty()) {
    std::ofstream out(report_path);
    out << report.toJson(2) << "\n";
    if (!out) throw IoError("cannot write " + report_path);
  }
  if (format == "json") std::cout << report.toJson(2) << "\n";
  else std::cout << campaign::formatReportTable(report);
  return report.passed() ? 0 : 1;
}

}  // namespace

int runCampaign(const std::vector<std::string>& args) {
  if (args.empty()) throw InvalidArgument("campaign needs validate, show or compare");
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "validate") return validate(rest);
  if (args[0] == "show") return show(rest);
  if (args[0] == "compare") return compare(rest);
  throw InvalidArgument("unknown campaign command '" + args[0] + "'");
}

}  // namespace lmr::cli
