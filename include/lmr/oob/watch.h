// How the out-of-band daemon watches its rank, in seconds: the defaults that lmr-oobd's
// command line and Python's HangDetectionConfig share, and their validation, defined once.
#pragma once

#include <cstdint>
#include <string>

#include "lmr/oob/diagnose.h"
#include "lmr/oob/progress.h"

namespace lmr::oob {

struct WatchOptions {
  double threshold_s = 60.0;      // no visible progress for this long is a stall
  // The same before the process's first completed step (lazy initialisation, a checkpoint
  // load, torch.compile and autotuning happen there); never below threshold_s.
  double warmup_threshold_s = 600.0;
  double poll_s = 0.1;            // how often the daemon reads the progress record
  double join_s = 1.0;            // a stall round waits this long for the other daemons
  double gather_s = 2.0;          // bound on the Gloo exchange of a round
  double setup_timeout_s = 60.0;  // every daemon of the job must be up within this
  // DataLoader and checkpoint I/O stall thresholds (DiagnosisOptions, in seconds).
  double io_absolute_s = static_cast<double>(DiagnosisOptions{}.io_absolute_ns) / 1e9;
  double io_relative = DiagnosisOptions{}.io_relative;
  double io_persistence_s = static_cast<double>(DiagnosisOptions{}.io_persistence_ns) / 1e9;

  // Throws InvalidArgument "<owner>.<field> must be a positive number, got <value>" for the
  // first field that is not positive and finite, and when poll_s is not below threshold_s.
  void validate(const std::string& owner = "WatchOptions") const;
  DiagnosisOptions diagnosis() const;
};

// The quiet time after which a rank's daemon starts a stall round: threshold_ns, or
// warmup_threshold_ns (never less) while the rank's process has completed no step.
std::int64_t stallThresholdNs(const Snapshot& s, std::int64_t threshold_ns, std::int64_t warmup_threshold_ns) noexcept;

}  // namespace lmr::oob
