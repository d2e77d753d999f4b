"""PyTorch Lightning (integrations/lightning.py, frameworks/lightning.py) on 4 CPU ranks with a transformers GPT-2 built
from a config: ResilienceCallback on the Trainer under DDP and under ModelParallelStrategy
(FSDP2 via configure_model), with gradient accumulation and with manual optimization;
protect_fabric on Fabric; each a campaign of block-output, gradient and weight SDC and a
compute delay, localized. The adapter conformance suite on Lightning's closure-driven step,
a fault-free run whose certified Lightning checkpoints resume, and the set-ups refused."""

import os

import pytest

pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")

import lightning_workers as lw  # noqa: E402
from lm_resiliency.errors import InvalidArgumentError  # noqa: E402
from hf_workers import assert_four_localized  # noqa: E402
from lm_resiliency.integrations.lightning import ResilienceCallback, trusted_checkpoint  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from test_scout import replay_results  # noqa: E402

pytestmark = pytest.mark.distributed

EXPECTED = ["matches", "structure", "tensors", "optimizer", "loads", "communication", "replay"]


def _run(fn, *args):
    return spawn(fn, 4, preload=lw.PRELOAD, env=lw.ENV, timeout=600, args=args)


def test_conformance():
    # Lightning steps with optimizer.step(closure): the update replayed from the snapshot the
    # boundary takes must be this step's (the closure's backward ran first).
    out = _run(lw.conformance)
    assert all(name == "lightning" and checks == EXPECTED for name, checks in out), out


def _localized(per_rank, steps):
    assert all("error" not in out for out in per_rank), per_rank[0].get("error")
    assert all(out["completed"] == steps for out in per_rank)
    assert_four_localized(per_rank)


@pytest.mark.parametrize("strategy,ga,manual", [("ddp", 2, False), ("fsdp2", 2, False), ("ddp", 1, True)],
                         ids=["ddp-accumulate2", "fsdp2-accumulate2", "ddp-manual"])
def test_trainer_campaign_is_localized(strategy, ga, manual, tmp_path):
    per_rank = _run(lw.fit, str(tmp_path), 26, strategy, ga, True, True, 1, "cpu", manual)
    assert per_rank[0]["adapter"] == "lightning" and per_rank[0]["global_step"] == 26
    _localized(per_rank, 26)


def test_fabric_campaign_is_localized(tmp_path):
    per_rank = _run(lw.fabric_run, str(tmp_path), 26)
    assert per_rank[0]["adapter"] == "pytorch"  # Fabric's loop is a plain PyTorch loop underneath
    _localized(per_rank, 26)


def test_certified_lightning_checkpoints_resume(tmp_path):
    first = _run(lw.fit, str(tmp_path), 12, "ddp", 1, False)
    results = replay_results(first[0]["results"])
    assert results and all(r.status == "Agree" for r in results), [(r.step, r.status) for r in results]
    assert first[0]["committed"], first[0]
    ckpt = trusted_checkpoint(str(tmp_path))
    assert os.path.isfile(ckpt) and os.path.basename(os.path.dirname(ckpt)) == first[0]["committed"][-1]
    step = int(os.path.basename(os.path.dirname(ckpt)).split("-")[1])
    # Lightning resumes it (ckpt_path) and the protection continues from its step.
    resumed = _run(lw.fit, str(tmp_path), 16, "ddp", 1, False)
    assert resumed[0]["start_step"] == step and resumed[0]["global_step"] == resumed[0]["completed"] == 16
    # A Trainer started anywhere else is refused when training starts, with the line to use.
    again = _run(lw.fit, str(tmp_path), 16, "ddp", 1, False, False)
    assert all("ckpt_path=lm_resiliency.integrations.lightning.trusted_checkpoint(" in o["error"]
               and "the trainer started at step 0" in o["error"] for o in again), again[0]


def test_set_ups_it_cannot_protect_are_refused_when_training_starts(tmp_path):
    said = _run(lw.refused, str(tmp_path))[0]
    assert "tensor parallelism through Lightning is not supported" in said["tensor-parallel"]
    assert "configures 2 optimizers" in said["two-optimizers"]
    with pytest.raises(InvalidArgumentError, match="checkpoints belong to Lightning"):
        ResilienceCallback(str(tmp_path), checkpoints=False)


@pytest.mark.gpu
def test_fsdp_version_1_is_refused_on_the_gpu(tmp_path):
    """Lightning runs strategy="fsdp" (FullyShardedDataParallel) on a GPU only."""
    said = spawn(lw.refused, 1, preload=lw.PRELOAD, env={**lw.ENV, "LOCAL_WORLD_SIZE": "1"}, timeout=600,
                 args=(str(tmp_path), (("fsdp1", "fsdp", 1),), "cuda"))[0]
    assert "FSDP version 1" in said["fsdp1"] and "ModelParallelStrategy" in said["fsdp1"], said
