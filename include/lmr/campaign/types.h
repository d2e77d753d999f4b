// Vocabulary of fault-injection campaigns: failure types, surfaces, lifetimes, temporal and
// safety classes, record statuses. Each enum has a stable wire name (the JSON spelling).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace lmr::campaign {

enum class FailureType : std::uint8_t {
  // numerical and state
  kTensorCorruption,
  kStaleState,
  kDrop,
  kDuplicate,
  kReorder,
  kConfigDrift,
  // performance and liveness
  kDelay,
  kHang,
  kTimeout,
  // runtime and availability
  kException,
  kResourceExhaustion,
  kProcessTermination,
  kResourceUnavailable,
  // checkpoint and storage
  kCheckpointCorruption,
  kCheckpointTruncation,
  kCheckpointMissing,
  kIoError,
  // communication
  kPayloadCorruption,
  kCollectiveDesync,
  kMessageDrop,
  kNetworkPartition,
};

enum class Surface : std::uint8_t {
  kInput,
  kOutput,
  kWeight,
  kBias,
  kGradient,
  kOptimizerState,
  kRngState,
  kSamplerState,
  kData,
  kCheckpoint,
  kCompute,
  kCollective,
  kProcess,
  kResource,
  kConfig,
};

enum class ClockOrigin : std::uint8_t { kTrainingRun, kCampaignStart };
enum class Retrigger : std::uint8_t { kOnce, kEveryAttempt, kMaxOccurrences };
enum class LifetimeKind : std::uint8_t { kMatchingCalls, kIterations, kUntil };
enum class Until : std::uint8_t { kRecovery, kReplacement, kCampaignEnd };
enum class TemporalClass : std::uint8_t { kTransient, kIntermittent, kPermanent };
// Ordered: a ceiling of kClusterDestructive admits everything.
enum class SafetyClass : std::uint8_t { kSafeInProcess = 0, kIsolatedDestructive = 1, kClusterDestructive = 2 };
enum class RecordStatus : std::uint8_t { kSkippedProbability, kArmed, kActive, kCompleted, kFailed, kCancelled };

std::string_view name(FailureType v) noexcept;
std::string_view name(Surface v) noexcept;
std::string_view name(ClockOrigin v) noexcept;
std::string_view name(Retrigger v) noexcept;
std::string_view name(Until v) noexcept;
std::string_view name(TemporalClass v) noexcept;
std::string_view name(SafetyClass v) noexcept;
std::string_view name(RecordStatus v) noexcept;

std::optional<FailureType> parseFailureType(std::string_view s) noexcept;
std::optional<Surface> parseSurface(std::string_view s) noexcept;
std::optional<ClockOrigin> parseClockOrigin(std::string_view s) noexcept;
std::optional<Retrigger> parseRetrigger(std::string_view s) noexcept;
std::optional<Until> parseUntil(std::string_view s) noexcept;
std::optional<TemporalClass> parseTemporalClass(std::string_view s) noexcept;
std::optional<SafetyClass> parseSafetyClass(std::string_view s) noexcept;
std::optional<RecordStatus> parseRecordStatus(std::string_view s) noexcept;

// Surfaces that name a module of the model (they need `module_path` or `component`).
bool isModuleSurface(Surface s) noexcept;
// Module surfaces that act on one of the module's parameters (weight, bias, gradient,
// optimizer_state): the fault names it with parameters.parameter.
bool isParameterSurface(Surface s) noexcept;
// Surfaces holding parameter state (weight, bias, optimizer_state).
bool isStateSurface(Surface s) noexcept;

// Whether (type, surface) is an effect of the built-in local executor; its parameters are
// then validated strictly when the manifest is parsed. Otherwise parameters belong to the
// executor that implements the effect and are only required to be finite JSON.
bool isBuiltInEffect(FailureType type, Surface surface) noexcept;

// The least safety ceiling an executor needs to run (type, surface); see docs/campaigns.md.
SafetyClass requiredSafety(FailureType type, Surface surface) noexcept;

// The failure kind a localization system is expected to report for (type, surface):
// "sdc", "straggler" ("comm_straggler" for a delay on the collective surface), "hang",
// "process_failure", "checkpoint_failure" or "config_drift".
std::string_view expectedKind(FailureType type, Surface surface) noexcept;

}  // namespace lmr::campaign
