// Subcommands of the lmr CLI. Each returns the process exit status and throws
// lmr::InvalidArgument for usage errors (exit 2).
#pragma once

#include <string>
#include <vector>

namespace lmr::cli {

int runCampaign(const std::vector<std::string>& args);
int runHealth(const std::vector<std::string>& args);
int runCkpt(const std::vector<std::string>& args);

extern const char* const kCampaignUsage;
extern const char* const kHealthUsage;
extern const char* const kCkptUsage;

}  // namespace lmr::cli
