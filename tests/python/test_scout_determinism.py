"""Replays must be bit-reproducible so that equivalent peers agree: strict deterministic
mode on CUDA (torch's attention backward kernels are otherwise non-deterministic), with a
per-recipe fallback when an operation has no deterministic kernel."""

import warnings

import pytest
import torch

from lm_resiliency.scout.determinism import Determinism
from lm_resiliency.workloads import Decoder, DecoderConfig


def test_a_recipe_without_deterministic_kernels_falls_back_once_with_a_warning():
    d = Determinism(True, torch.device("cpu"))
    d.strict = True  # as on CUDA
    modes = []

    def body():
        modes.append(torch.is_deterministic_algorithms_warn_only_enabled())
        if not modes[-1]:
            raise RuntimeError("index_put_ does not have a deterministic implementation, but you set "
                               "'torch.use_deterministic_algorithms(True)'")
        return "done"

    with pytest.warns(RuntimeWarning, match="'hidden.3'.*warn-only"):
        assert d.run("hidden.3", 7, body) == "done"
    assert modes == [False, True] and d.lenient == {"hidden.3"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert d.run("hidden.3", 7, body) == "done"  # lenient from now on, no second warning
    assert modes == [False, True, True]
    assert not torch.are_deterministic_algorithms_enabled()  # the user's setting is back


def test_other_errors_are_not_swallowed():
    d = Determinism(True, torch.device("cpu"))
    d.strict = True

    def body():
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        d.run("output", 1, body)
    assert d.lenient == set()


def test_cpu_keeps_warn_only_mode_and_the_seed():
    d = Determinism(True, torch.device("cpu"))
    assert not d.strict
    draws = [d.run("embedding", 5, lambda: (torch.is_deterministic_algorithms_warn_only_enabled(), torch.rand(3)))
             for _ in range(2)]
    assert draws[0][0] and torch.equal(draws[0][1], draws[1][1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_block_replay_is_bit_reproducible_on_cuda(dtype):
    """Large enough for split-key attention backward (non-deterministic outside strict mode)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=1024, dim=1024, n_layers=1, n_heads=8, ffn_hidden=2731, max_seq_len=1024)
    model = Decoder(cfg).cuda().to(dtype)
    block, cos, sin = model.layers[0], model.rope_cos, model.rope_sin
    x = torch.randn(4, 1024, 1024, device="cuda", dtype=dtype)
    d = Determinism(True, torch.device("cuda"))
    assert d.strict

    def replay():
        xi = x.clone().requires_grad_(True)
        for p in block.parameters():
            p.grad = None
        out = block(xi, cos, sin)
        out.backward(torch.randn_like(out))
        return [xi.grad.clone()] + [p.grad.clone() for p in block.parameters()]

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback: every kernel is deterministic
        runs = [d.run("hidden.0", 11, replay) for _ in range(4)]
    assert d.lenient == set()
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
