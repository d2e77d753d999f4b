"""Hugging Face Accelerate: protect_accelerator() after accelerator.prepare() on 4 CPU ranks
(Accelerate's MULTI_CPU: DDP over gloo) with a transformers GPT-2: the adapter conformance
suite, a campaign of block-output, gradient and weight SDC and a compute delay localized with
gradient accumulation (the clock counts Accelerate's synchronized updates, not micro-batches),
a fault-free run with every check Agree, and the set-ups it refuses. FSDP2 and DeepSpeed
through Accelerate need a GPU (Accelerate's CPU path is DDP only): the gpu-marked tests."""

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

import accelerate_workers as aw  # noqa: E402
from hf_workers import assert_four_localized  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from test_scout import replay_results  # noqa: E402

pytestmark = pytest.mark.distributed

EXPECTED = ["matches", "structure", "tensors", "optimizer", "loads", "communication", "replay"]


def test_conformance():
    out = spawn(aw.conformance, 4, preload=aw.PRELOAD, timeout=600)
    assert all(name == "accelerate" and checks == EXPECTED for name, checks in out), out


def _campaign_run(tmp_path, ga, steps=26, device="cpu", fsdp2=False, deepspeed_stage=None, world=4):
    per_rank = spawn(aw.train, world, preload=aw.PRELOAD, timeout=600,
                     args=(str(tmp_path), steps, ga, True, device, fsdp2, deepspeed_stage))
    results = assert_four_localized(per_rank)
    # One boundary per synchronized update: the clock never counts a micro-batch.
    assert all(out["clock"] == list(range(1, steps + 1)) and out["micro_steps"] == steps * ga for out in per_rank)
    return per_rank, results


def test_campaign_is_localized_with_gradient_accumulation(tmp_path):
    per_rank, results = _campaign_run(tmp_path, ga=2)
    assert per_rank[0]["adapter"] == "accelerate"
    assert all(r.status == "Agree" for r in results if r.step in (1, 2, 6, 7))


def test_fault_free_run_agrees(tmp_path):
    per_rank = spawn(aw.train, 4, preload=aw.PRELOAD, timeout=600, args=(str(tmp_path), 10, 1, False))
    results = replay_results(per_rank[0]["results"])
    assert len(results) == 10
    assert all(r.status == "Agree" for r in results), [(r.step, r.status, r.inconclusive_reasons) for r in results
                                                       if r.status != "Agree"]
    assert {"embedding", "hidden.0", "hidden.1", "output", "integrity"} <= {i for r in results
                                                                            for i in r.checked_recipe_ids}


def test_set_ups_it_cannot_protect_are_refused_before_training():
    cases = ["unprepared-model", "unwrapped-model", "inner-optimizer", "fsdp1", "megatron"]
    out = spawn(aw.refused, 2, preload=aw.PRELOAD, timeout=600, args=(cases,))
    said = out[0]
    assert out[1] == said  # every rank refuses alike
    assert "was not prepared by this accelerator" in said["unprepared-model"]
    assert "DistributedDataParallel" in said["unwrapped-model"]
    assert "pass the optimizer that accelerator.prepare() returned" in said["inner-optimizer"]
    assert "fsdp_version=2" in said["fsdp1"]
    assert "MEGATRON_LM back end is not supported" in said["megatron"]


@pytest.mark.gpu
@pytest.mark.parametrize("fsdp2,stage", [(True, None), (False, 2)], ids=["fsdp2", "deepspeed-zero2"])
def test_campaign_under_fsdp2_and_deepspeed_on_the_gpu(fsdp2, stage, tmp_path):
    """The accelerator machine: 4 ranks sharing GPU 0 through gloo, Accelerate's FSDP2 (its
    fully_shard of each GPT2Block) and DeepSpeed ZeRO 2, gradient accumulation 2."""
    per_rank, _ = _campaign_run(tmp_path, ga=2, device="cuda", fsdp2=fsdp2, deepspeed_stage=stage)
    assert per_rank[0]["adapter"] == ("accelerate" if fsdp2 else "deepspeed")
