#include "lmr/campaign/types.h"

#include <array>
#include <utility>

namespace lmr::campaign {
namespace {

template <typename E, std::size_t N>
using Names = std::array<std::pair<E, std::string_view>, N>;

constexpr Names<FailureType, 21> kFailureTypes = {{
    {FailureType::kTensorCorruption, "tensor_corruption"},
    {FailureType::kStaleState, "stale_state"},
    {FailureType::kDrop, "drop"},
    {FailureType::kDuplicate, "duplicate"},
    {FailureType::kReorder, "reorder"},
    {FailureType::kConfigDrift, "config_drift"},
    {FailureType::kDelay, "delay"},
    {FailureType::kHang, "hang"},
    {FailureType::kTimeout, "timeout"},
    {FailureType::kException, "exception"},
    {FailureType::kResourceExhaustion, "resource_exhaustion"},
    {FailureType::kProcessTermination, "process_termination"},
    {FailureType::kResourceUnavailable, "resource_unavailable"},
    {FailureType::kCheckpointCorruption, "checkpoint_corruption"},
    {FailureType::kCheckpointTruncation, "checkpoint_truncation"},
    {FailureType::kCheckpointMissing, "checkpoint_missing"},
    {FailureType::kIoError, "io_error"},
    {FailureType::kPayloadCorruption, "payload_corruption"},
    {FailureType::kCollectiveDesync, "collective_desync"},
    {FailureType::kMessageDrop, "message_drop"},
    {FailureType::kNetworkPartition, "network_partition"},
}};

constexpr Names<Surface, 15> kSurfaces = {{
    {Surface::kInput, "input"},
    {Surface::kOutput, "output"},
    {Surface::kWeight, "weight"},
    {Surface::kBias, "bias"},
    {Surface::kGradient, "gradient"},
    {Surface::kOptimizerState, "optimizer_state"},
    {Surface::kRngState, "rng_state"},
    {Surface::kSamplerState, "sampler_state"},
    {Surface::kData, "data"},
    {Surface::kCheckpoint, "checkpoint"},
    {Surface::kCompute, "compute"},
    {Surface::kCollective, "collective"},
    {Surface::kProcess, "process"},
    {Surface::kResource, "resource"},
    {Surface::kConfig, "config"},
}};

constexpr Names<ClockOrigin, 2> kOrigins = {
    {{ClockOrigin::kTrainingRun, "training_run"}, {ClockOrigin::kCampaignStart, "campaign_start"}}};
constexpr Names<Retrigger, 3> kRetriggers = {{{Retrigger::kOnce, "once"},
                                              {Retrigger::kEveryAttempt, "every_attempt"},
                                              {Retrigger::kMaxOccurrences, "max_occurrences"}}};
constexpr Names<Until, 3> kUntils = {
    {{Until::kRecovery, "recovery"}, {Until::kReplacement, "replacement"}, {Until::kCampaignEnd, "campaign_end"}}};
constexpr Names<TemporalClass, 3> kTemporal = {{{TemporalClass::kTransient, "transient"},
                                                {TemporalClass::kIntermittent, "intermittent"},
                                                {TemporalClass::kPermanent, "permanent"}}};
constexpr Names<SafetyClass, 3> kSafety = {{{SafetyClass::kSafeInProcess, "safe_in_process"},
                                            {SafetyClass::kIsolatedDestructive, "isolated_destructive"},
                                            {SafetyClass::kClusterDestructive, "cluster_destructive"}}};
constexpr Names<RecordStatus, 6> kStatuses = {{{RecordStatus::kSkippedProbability, "skipped_probability"},
                                               {RecordStatus::kArmed, "armed"},
                                               {RecordStatus::kActive, "active"},
                                               {RecordStatus::kCompleted, "completed"},
                                               {RecordStatus::kFailed, "failed"},
                                               {RecordStatus::kCancelled, "cancelled"}}};

template <typename E, std::size_t N>
std::string_view lookup(const Names<E, N>& table, E v) noexcept {
  for (const auto& [e, n] : table)
    if (e == v) return n;
  return "?";
}

template <typename E, std::size_t N>
std::optional<E> parse(const Names<E, N>& table, std::string_view s) noexcept {
  for (const auto& [e, n] : table)
    if (n == s) return e;
  return std::nullopt;
}

}  // namespace

std::string_view name(FailureType v) noexcept { return lookup(kFailureTypes, v); }
std::string_view name(Surface v) noexcept { return lookup(kSurfaces, v); }
std::string_view name(ClockOrigin v) noexcept { return lookup(kOrigins, v); }
std::string_view name(Retrigger v) noexcept { return lookup(kRetriggers, v); }
std::string_view name(Until v) noexcept { return lookup(kUntils, v); }
std::string_view name(TemporalClass v) noexcept { return lookup(kTemporal, v); }
std::string_view name(SafetyClass v) noexcept { return lookup(kSafety, v); }
std::string_view name(RecordStatus v) noexcept { return lookup(kStatuses, v); }

std::optional<FailureType> parseFailureType(std::string_view s) noexcept { return parse(kFailureTypes, s); }
std::optional<Surface> parseSurface(std::string_view s) noexcept { return parse(kSurfaces, s); }
std::optional<ClockOrigin> parseClockOrigin(std::string_view s) noexcept { return parse(kOrigins, s); }
std::optional<Retrigger> parseRetrigger(std::string_view s) noexcept { return parse(kRetriggers, s); }
std::optional<Until> parseUntil(std::string_view s) noexcept { return parse(kUntils, s); }
std::optional<TemporalClass> parseTemporalClass(std::string_view s) noexcept { return parse(kTemporal, s); }
std::optional<SafetyClass> parseSafetyClass(std::string_view s) noexcept { return parse(kSafety, s); }
std::optional<RecordStatus> parseRecordStatus(std::string_view s) noexcept { return parse(kStatuses, s); }

bool isModuleSurface(Surface s) noexcept {
  switch (s) {
    case Surface::kInput:
    case Surface::kOutput:
    case Surface::kWeight:
    case Surface::kBias:
    case Surface::kGradient:
    case Surface::kOptimizerState:
    case Surface::kCompute: return true;
    default: return false;
  }
}

bool isParameterSurface(Surface s) noexcept { return isStateSurface(s) || s == Surface::kGradient; }

bool isStateSurface(Surface s) noexcept {
  return s == Surface::kWeight || s == Surface::kBias || s == Surface::kOptimizerState;
}

bool isBuiltInEffect(FailureType type, Surface surface) noexcept {
  const bool tensor = isModuleSurface(surface) && surface != Surface::kCompute;
  const bool flow = surface == Surface::kInput || surface == Surface::kOutput || surface == Surface::kGradient;
  switch (type) {
    case FailureType::kTensorCorruption:
    case FailureType::kStaleState:
    case FailureType::kDuplicate: return tensor;
    case FailureType::kDrop:
    case FailureType::kReorder: return flow;
    case FailureType::kDelay: return isModuleSurface(surface);
    default: return false;
  }
}

SafetyClass requiredSafety(FailureType type, Surface surface) noexcept {
  if (isBuiltInEffect(type, surface)) return SafetyClass::kSafeInProcess;
  switch (type) {
    case FailureType::kConfigDrift:
    case FailureType::kTensorCorruption:
    case FailureType::kStaleState:
    case FailureType::kDuplicate:
      // State or data outside the built-in surfaces (rng, sampler, data, config).
      return surface == Surface::kCollective ? SafetyClass::kClusterDestructive : SafetyClass::kSafeInProcess;
    case FailureType::kDrop:
    case FailureType::kReorder:
      return surface == Surface::kCollective ? SafetyClass::kClusterDestructive : SafetyClass::kSafeInProcess;
    case FailureType::kDelay:
    case FailureType::kException:
    case FailureType::kTimeout:
    case FailureType::kHang:
    case FailureType::kProcessTermination:
    case FailureType::kResourceExhaustion:
    case FailureType::kCheckpointCorruption:
    case FailureType::kCheckpointTruncation:
    case FailureType::kCheckpointMissing:
    case FailureType::kIoError:
    case FailureType::kPayloadCorruption: return SafetyClass::kIsolatedDestructive;
    case FailureType::kResourceUnavailable:
    case FailureType::kCollectiveDesync:
    case FailureType::kMessageDrop:
    case FailureType::kNetworkPartition: return SafetyClass::kClusterDestructive;
  }
  return SafetyClass::kClusterDestructive;
}

std::string_view expectedKind(FailureType type, Surface surface) noexcept {
  switch (type) {
    case FailureType::kTensorCorruption:
    case FailureType::kStaleState:
    case FailureType::kPayloadCorruption: return "sdc";
    case FailureType::kDrop:
    case FailureType::kDuplicate:
    case FailureType::kReorder: return surface == Surface::kCollective ? "hang" : "sdc";
    case FailureType::kConfigDrift: return "config_drift";
    case FailureType::kDelay: return surface == Surface::kCollective ? "comm_straggler" : "straggler";
    case FailureType::kHang:
    case FailureType::kTimeout:
    case FailureType::kCollectiveDesync:
    case FailureType::kMessageDrop:
    case FailureType::kNetworkPartition: return "hang";
    case FailureType::kException:
    case FailureType::kResourceExhaustion:
    case FailureType::kProcessTermination:
    case FailureType::kResourceUnavailable: return "process_failure";
    case FailureType::kCheckpointCorruption:
    case FailureType::kCheckpointTruncation:
    case FailureType::kCheckpointMissing:
    case FailureType::kIoError: return "checkpoint_failure";
  }
  return "unknown";
}

}  // namespace lmr::campaign
