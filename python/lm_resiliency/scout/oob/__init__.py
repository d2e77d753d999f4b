"""SCOUT's out-of-band path: hang, stall and collective desynchronization localization
while the training process may be blocked (see monitor.py)."""

from lm_resiliency.scout.oob.config import HangDetectionConfig, derived_port
from lm_resiliency.scout.oob.monitor import HangMonitor
from lm_resiliency.progress import checkpoint_io, instrument_dataloader
from lm_resiliency.scout.oob.report import KIT_KINDS, SCOUTFaultReport

__all__ = ["HangDetectionConfig", "HangMonitor", "KIT_KINDS", "SCOUTFaultReport", "checkpoint_io", "derived_port",
           "instrument_dataloader"]
