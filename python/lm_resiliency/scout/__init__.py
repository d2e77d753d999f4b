"""SCOUT: localizing silent data corruption and compute stragglers by replaying work on
equivalent data-parallel peers and letting a strict majority of them decide."""

from lm_resiliency.scout.config import ReplayHarnessConfig
from lm_resiliency.scout.harness import ReplayHarness
from lm_resiliency.scout.result import ReplayResult, SurfaceResult
from lm_resiliency.scout.scoring import localization_results

__all__ = ["ReplayHarness", "ReplayHarnessConfig", "ReplayResult", "SurfaceResult", "localization_results"]
