// libFuzzer target: campaign manifests, journals, localization and injection artifacts.
// Any input must either parse or raise lmr::InvalidArgument; a parsed manifest's canonical
// text must parse again to the same identity. Run with `make fuzz`.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lmr/campaign/compare.h"
#include "lmr/campaign/journal.h"
#include "lmr/campaign/schedule.h"
#include "lmr/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  using namespace lmr::campaign;
  try {
    const Campaign c = Campaign::parse(text, "fuzz");
    const Campaign again = Campaign::parse(c.canonicalJson(), "canonical");
    if (again.identity() != c.identity()) __builtin_trap();
    // Exercise the schedule over a bounded window.
    std::size_t n = 0;
    forEachCandidate(c, 0, 0, 4096, [&](const Candidate&) { ++n; });
    checkTargetOverlaps(c, [](std::size_t, std::size_t f) { return std::to_string(f); });
  } catch (const lmr::InvalidArgument&) {
  }
  try {
    Journal::parse(text, "fuzz");
  } catch (const lmr::InvalidArgument&) {
  }
  try {
    parseLocalizationArtifact(text, "fuzz");
  } catch (const lmr::InvalidArgument&) {
  }
  try {
    InjectionArtifact::parse(text, "fuzz");
  } catch (const lmr::InvalidArgument&) {
  }
  return 0;
}
