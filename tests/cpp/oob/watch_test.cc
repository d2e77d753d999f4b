#include "lmr/oob/watch.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "lmr/common/error.h"

namespace lmr::oob {
namespace {

std::string errorOf(const WatchOptions& o) {
  try {
    o.validate("HangDetectionConfig");
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(WatchOptions, DefaultsAreValidAndMatchTheDiagnosis) {
  const WatchOptions o;
  EXPECT_EQ(errorOf(o), "");
  EXPECT_EQ(o.threshold_s, 60.0);
  EXPECT_EQ(o.warmup_threshold_s, 600.0);
  EXPECT_EQ(o.poll_s, 0.1);
  const DiagnosisOptions d = o.diagnosis();
  EXPECT_EQ(d.io_absolute_ns, DiagnosisOptions{}.io_absolute_ns);
  EXPECT_EQ(d.io_relative, DiagnosisOptions{}.io_relative);
  EXPECT_EQ(d.io_persistence_ns, DiagnosisOptions{}.io_persistence_ns);
}

TEST(WatchOptions, ValidationNamesTheField) {
  WatchOptions o;
  o.join_s = 0;
  EXPECT_EQ(errorOf(o), "HangDetectionConfig.join_s must be a positive number, got 0");
  o = WatchOptions{};
  o.io_relative = std::numeric_limits<double>::infinity();
  EXPECT_EQ(errorOf(o), "HangDetectionConfig.io_relative must be a positive number, got inf");
  o = WatchOptions{};
  o.warmup_threshold_s = -1;
  EXPECT_EQ(errorOf(o), "HangDetectionConfig.warmup_threshold_s must be a positive number, got -1");
  o = WatchOptions{};
  o.threshold_s = 1;
  o.poll_s = 2;
  EXPECT_EQ(errorOf(o), "HangDetectionConfig.poll_s must be smaller than threshold_s");
  o = WatchOptions{};
  o.io_absolute_s = 1.5;
  EXPECT_EQ(o.diagnosis().io_absolute_ns, 1'500'000'000);
}

TEST(WatchOptions, TheFirstStepOfAProcessHasTheWarmupThreshold) {
  Snapshot s;
  s.step = 40;  // resumed at step 40: still this process's first step
  EXPECT_EQ(stallThresholdNs(s, 2'000, 9'000), 9'000);
  EXPECT_EQ(stallThresholdNs(s, 2'000, 1'000), 2'000);  // never below the threshold
  s.steps_here = 1;
  EXPECT_EQ(stallThresholdNs(s, 2'000, 9'000), 2'000);
}

}  // namespace
}  // namespace lmr::oob
