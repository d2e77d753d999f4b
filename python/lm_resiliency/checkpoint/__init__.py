"""Certified checkpoints: capture and trust at the optimizer boundary (certify.py), the
callback contract (config.py), the built-in adapter over torch.distributed.checkpoint
(dcp.py), the node-local fast tier (latest.py). Decisions and the trust manifest are
lmr::ckpt's; the restart loop is lm_resiliency.recovery."""

from lm_resiliency._core import CkptCheckpoint, CkptManifest, RecoveryDecision, select_recovery
from lm_resiliency.checkpoint.certify import CheckpointCertifier
from lm_resiliency.checkpoint.manifest_io import read_manifest
from lm_resiliency.checkpoint.config import RECOVERY_EXIT_CODE, DurableCheckpointConfig
from lm_resiliency.checkpoint.dcp import DCPCheckpointer
from lm_resiliency.checkpoint.latest import LatestTier, LocalSnapshotTier

__all__ = [
    "CheckpointCertifier",
    "CkptCheckpoint",
    "CkptManifest",
    "DCPCheckpointer",
    "DurableCheckpointConfig",
    "LatestTier",
    "LocalSnapshotTier",
    "RECOVERY_EXIT_CODE",
    "RecoveryDecision",
    "read_manifest",
    "select_recovery",
]
