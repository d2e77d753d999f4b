"""SCOUT: localizing silent data corruption and compute stragglers by replaying work on
equivalent data-parallel peers and letting a strict majority of them decide; and hangs,
stalls and collective desynchronization out of band (``scout.oob``)."""

from lm_resiliency.scout.alltoall_policy import AllToAllReplayPolicy, BoundedAllToAllPolicy, ObservedAllToAllPolicy
from lm_resiliency.scout.config import ReplayHarnessConfig
from lm_resiliency.scout.oob import (HangDetectionConfig, HangMonitor, SCOUTFaultReport, checkpoint_io,
                                     instrument_dataloader)
from lm_resiliency.scout.harness import ReplayHarness
from lm_resiliency.scout.result import ReplayResult, SurfaceResult
from lm_resiliency.scout.scoring import (Attribution, explain_attributions, hang_localization_results, localization_results,
                                        occurrence_windows)

__all__ = ["AllToAllReplayPolicy", "Attribution", "BoundedAllToAllPolicy", "HangDetectionConfig", "HangMonitor", "ReplayHarness", "ReplayHarnessConfig", "ReplayResult",
           "SCOUTFaultReport", "SurfaceResult", "checkpoint_io", "explain_attributions", "hang_localization_results",
           "instrument_dataloader", "localization_results", "ObservedAllToAllPolicy", "occurrence_windows"]
