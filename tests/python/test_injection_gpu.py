"""Built-in effects on CUDA tensors (run on the accelerator machine)."""

import pytest
import torch

import lm_resiliency as lmr
from injection_util import Tiny, campaign, changed_indices, incident, selection

pytestmark = pytest.mark.gpu


def test_cuda_output_and_weight_effects():
    torch.manual_seed(0)
    model = Tiny().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = {}

    def keep(key, value):  # hooks return None: they only look
        seen.setdefault(key, value.detach().clone())

    model.layers[0].register_forward_hook(lambda m, i, o: keep("before", o))
    w_before = model.layers[1].weight.detach().clone()
    s = lmr.enable_fault_injection(model, opt, campaign=campaign(
        incident("o", [1], "tensor_corruption", {"module_path": "layers.0", "surface": "output"},
                 {"operation": "sign_flip", "scope": "10%"}),
        incident("w", [1], "tensor_corruption", {"module_path": "layers.1", "surface": "weight"},
                 {"operation": "single_bitflip", "magnitude": "catastrophic", "scope": "1%"}, {"iterations": 1})))
    model.layers[1].register_forward_pre_hook(lambda m, a: keep("after", a[0]))
    w_armed = model.layers[1].weight.detach().clone()
    assert changed_indices(w_before, w_armed) == selection(5, "w@1/f", "1%", w_before)
    x = torch.randn(6, 8, device="cuda")
    torch.nn.functional.cross_entropy(model(x), torch.zeros(6, dtype=torch.long, device="cuda")).backward()
    opt.step()
    s.close()
    expected = selection(5, "o@1/f", "10%", seen["before"])
    assert changed_indices(seen["before"], seen["after"]) == [i for i in expected if seen["before"].reshape(-1)[i] != 0]
    assert seen["after"].is_cuda
    assert torch.equal(model.layers[1].weight, w_before)  # retired exactly, on the device
    assert all(r.to_dict()["status"] == "completed" for r in s.records())
