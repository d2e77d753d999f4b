#include "lmr/oob/watch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "lmr/common/error.h"

namespace lmr::oob {

void WatchOptions::validate(const std::string& owner) const {
  const std::pair<const char*, double> fields[] = {{"threshold_s", threshold_s},
                                                   {"warmup_threshold_s", warmup_threshold_s},
                                                   {"poll_s", poll_s},
                                                   {"join_s", join_s},
                                                   {"gather_s", gather_s},
                                                   {"setup_timeout_s", setup_timeout_s},
                                                   {"io_absolute_s", io_absolute_s},
                                                   {"io_relative", io_relative},
                                                   {"io_persistence_s", io_persistence_s}};
  for (const auto& [field, value] : fields) {
    if (!(value > 0.0) || !std::isfinite(value)) {
      // No iostreams in liblmr: they crashed inside _core next to torch (seen again on the
      // H200 with this very message).
      char number[32];
      std::snprintf(number, sizeof number, "%g", value);
      throw InvalidArgument(owner + "." + field + " must be a positive number, got " + number);
    }
  }
  if (poll_s >= threshold_s) throw InvalidArgument(owner + ".poll_s must be smaller than threshold_s");
}

std::int64_t stallThresholdNs(const Snapshot& s, std::int64_t threshold_ns, std::int64_t warmup_threshold_ns) noexcept {
  return s.steps_here == 0 ? std::max(threshold_ns, warmup_threshold_ns) : threshold_ns;
}

DiagnosisOptions WatchOptions::diagnosis() const {
  DiagnosisOptions d;
  d.io_absolute_ns = static_cast<std::int64_t>(io_absolute_s * 1e9);
  d.io_relative = io_relative;
  d.io_persistence_ns = static_cast<std::int64_t>(io_persistence_s * 1e9);
  return d;
}

}  // namespace lmr::oob
