import os
import sys

import pytest
import torch

# bench/torch_signature.py is the torch-ops reference of the signature.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
