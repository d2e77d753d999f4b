"""Certified checkpoints: capture and trust at the optimizer boundary (certify.py), the
callback contract (config.py), one factory over every framework's checkpoint back end
(backends.py; the back ends are in frameworks/), the node-local fast tier (latest.py).
Decisions and the trust manifest are lmr::ckpt's; the restart loop is lm_resiliency.recovery."""

from lm_resiliency._core import CkptCheckpoint, CkptManifest, RecoveryDecision, select_recovery
from lm_resiliency.checkpoint.backends import durable_checkpoints
from lm_resiliency.checkpoint.certify import CheckpointCertifier
from lm_resiliency.checkpoint.manifest_io import read_manifest
from lm_resiliency.checkpoint.config import RECOVERY_EXIT_CODE, DurableCheckpointConfig
from lm_resiliency.checkpoint.latest import LatestTier, LocalSnapshotTier
from lm_resiliency.frameworks.pytorch_checkpoint import DCPCheckpointer

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
    "durable_checkpoints",
    "read_manifest",
    "select_recovery",
]
