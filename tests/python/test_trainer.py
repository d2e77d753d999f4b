"""transformers.Trainer with ResilienceCallback (integrations/hf.py) on 4 CPU
ranks, fine-tuning a GPT-2 built from a config on random tokens: a campaign localized with
gradient accumulation, a fault-free run whose certified checkpoints are the Trainer's own, a
Trainer started away from the trusted checkpoint refused, and, under torchrun, an SDC that
relaunches the job from trusted_checkpoint(), scored by ``lmr campaign compare``."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

import trainer_workers as tw  # noqa: E402
from lm_resiliency.errors import InvalidArgumentError  # noqa: E402
from hf_workers import assert_four_localized  # noqa: E402
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord  # noqa: E402
from lm_resiliency.fault_injection.ground_truth import write_localization_artifact  # noqa: E402
from lm_resiliency.integrations.hf import ResilienceCallback, trusted_checkpoint  # noqa: E402
from lm_resiliency.scout import localization_results  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from test_scout import replay_results  # noqa: E402

pytestmark = pytest.mark.distributed
HERE = os.path.dirname(os.path.abspath(__file__))


def test_campaign_is_localized_with_gradient_accumulation(tmp_path):
    steps = 26
    per_rank = spawn(tw.train, 4, preload=tw.PRELOAD, timeout=600, args=(str(tmp_path), steps, 2))
    assert all(out["adapter"] == "accelerate" and out["completed"] == out["global_step"] == steps for out in per_rank)
    assert_four_localized(per_rank)


def test_fault_free_run_certifies_the_trainers_own_checkpoints(tmp_path):
    # save_steps=4: the Trainer keeps its checkpoint-4/8/12 (certified copies are hard links);
    # the other certified steps were saved for certification alone and moved out of its folder.
    per_rank = spawn(tw.train, 4, preload=tw.PRELOAD, timeout=600, args=(str(tmp_path), 12, 1, False, 2, 4))
    out = per_rank[0]
    results = replay_results(out["results"])
    assert results and all(r.status == "Agree" for r in results), [(r.step, r.status) for r in results]
    assert [f for f in out["listing"] if f.startswith("checkpoint-")] == ["checkpoint-12", "checkpoint-4",
                                                                         "checkpoint-8"]
    assert out["committed"], out  # RECOVERY_VERIFIED checkpoints, each a complete Trainer checkpoint
    newest = trusted_checkpoint(str(tmp_path))
    assert os.path.basename(newest) == out["committed"][-1]
    assert {"trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state_3.pth"} <= set(os.listdir(newest))
    # A Trainer that starts anywhere else (here: from scratch) is refused when training begins.
    again = spawn(tw.train, 4, preload=tw.PRELOAD, timeout=600, args=(str(tmp_path), 12, 1, False, 2, 4, False))
    assert all("resume_from_checkpoint=lm_resiliency.integrations.hf.trusted_checkpoint(" in o["error"]
               and "the trainer started at step 0" in o["error"] for o in again), again[0]


def test_a_save_the_ranks_cannot_finish_together_is_reported_not_raised(tmp_path):
    said = spawn(tw.broken_meeting, 2, preload=tw.PRELOAD, timeout=300, args=(str(tmp_path),))[0]
    assert said and "LmrIOError" in said and "could not meet after the save" in said, said
    assert not os.path.exists(tmp_path / "step-00000003")  # nothing placed


def test_options_the_trainer_owns_are_refused():
    with pytest.raises(InvalidArgumentError, match="checkpoints, scheduler belong to the Trainer"):
        ResilienceCallback(checkpoints=False, scheduler=object())


def _compare(directory, campaign, results):
    """`lmr campaign compare` over every attempt's injection artifacts and the checks' localization."""
    artifacts = sorted(os.path.join(directory, a, f) for a in os.listdir(directory) if a.startswith("attempt-")
                       and os.path.isdir(os.path.join(directory, a)) for f in os.listdir(os.path.join(directory, a)))
    records = [FaultInjectionRecord.from_dict(r) for path in artifacts for r in json.load(open(path))["records"]]
    located = localization_results(campaign, records, results)
    write_localization_artifact(os.path.join(directory, "localization.json"), located)
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    done = subprocess.run([lmr_cli, "campaign", "compare", "--injections", *artifacts, "--localization",
                           os.path.join(directory, "localization.json"), "--format", "json"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.long_by_design("torchrun launches the 4-rank Trainer twice (the relaunch after the SDC)")
def test_an_sdc_relaunches_the_trainer_from_the_trusted_checkpoint(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           "--max-restarts", "1", os.path.join(HERE, "trainer_run.py"), "--output-dir",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    first, second = (json.load(open(tmp_path / f"attempt-{a}.json")) for a in (0, 1))
    summary = json.load(open(tmp_path / "summary.json"))
    # The first attempt: the weight fault from step 9 is blamed on rank 1, and every rank left.
    blamed = replay_results(first["results"])[-1]
    assert first["resume_from"] is None and blamed.step >= 9 and blamed.sdc_ranks == [1], blamed.to_json()
    # The relaunch resumed the Trainer from the verified checkpoint the decision named, and the
    # recovery ended the fault: every later check agrees, and the run reaches its last step.
    assert os.path.basename(second["resume_from"]).startswith("step-")
    assert summary["start_step"] == int(os.path.basename(second["resume_from"]).split("-")[1]) < 9
    assert summary["global_step"] == summary["completed"] == 16
    later = replay_results(second["results"])
    assert later and all(r.status == "Agree" for r in later), [(r.step, r.status) for r in later]
    campaign = FaultCampaign.from_json(tw.until_recovery(9))
    totals = _compare(str(tmp_path), campaign, replay_results(first["results"]) + later)["totals"]
    assert totals["occurrences"] == totals["localized"] == 1, totals


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["fsdp2", "deepspeed"])
def test_campaign_under_the_trainers_fsdp2_and_deepspeed_on_the_gpu(backend, tmp_path):
    """The accelerator machine: 4 ranks sharing GPU 0 through gloo, the Trainer's FSDP2
    (fsdp_config fsdp_version 2) and DeepSpeed ZeRO 2 set up from TrainingArguments."""
    steps = 26
    per_rank = spawn(tw.train, 4, preload=tw.PRELOAD, timeout=900,
                     args=(str(tmp_path), steps, 2, True, 1, 0, True, False, "cuda", backend))
    assert "error" not in per_rank[0], per_rank[0]["error"]
    assert per_rank[0]["adapter"] == ("accelerate" if backend == "fsdp2" else "deepspeed")
    assert_four_localized(per_rank)
