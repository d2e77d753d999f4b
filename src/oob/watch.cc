#include "lmr/oob/watch.h"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <utility>

#include "lmr/common/error.h"

namespace lmr::oob {

void WatchOptions::validate(const std::string& owner) const {
  const std::pair<const char*, double> fields[] = {{"threshold_s", threshold_s},
                                                   {"poll_s", poll_s},
                                                   {"join_s", join_s},
                                                   {"gather_s", gather_s},
                                                   {"setup_timeout_s", setup_timeout_s},
                                                   {"io_absolute_s", io_absolute_s},
                                                   {"io_relative", io_relative},
                                                   {"io_persistence_s", io_persistence_s}};
  for (const auto& [field, value] : fields) {
    if (!(value > 0.0) || !std::isfinite(value)) {
      std::ostringstream text;
      text << owner << "." << field << " must be a positive number, got " << value;
      throw InvalidArgument(text.str());
    }
  }
  if (poll_s >= threshold_s) throw InvalidArgument(owner + ".poll_s must be smaller than threshold_s");
}

DiagnosisOptions WatchOptions::diagnosis() const {
  DiagnosisOptions d;
  d.io_absolute_ns = static_cast<std::int64_t>(io_absolute_s * 1e9);
  d.io_relative = io_relative;
  d.io_persistence_ns = static_cast<std::int64_t>(io_persistence_s * 1e9);
  return d;
}

}  // namespace lmr::oob
