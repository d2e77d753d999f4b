"""The DCP back end's old home: it is plain PyTorch's checkpoint back end now, beside the other
frameworks' (frameworks/pytorch_checkpoint.py; the file format in frameworks/checkpoint_files.py).
These names stay importable from here."""

from lm_resiliency.frameworks.checkpoint_files import (COMMITTED, MARKER, checkpoint_problems, commit_checkpoint,
                                                       quarantine_checkpoint)
from lm_resiliency.frameworks.pytorch_checkpoint import DCPCheckpointer

__all__ = ["COMMITTED", "MARKER", "DCPCheckpointer", "checkpoint_problems", "commit_checkpoint",
           "quarantine_checkpoint"]
