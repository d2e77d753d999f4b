"""transformers.Trainer under torchrun with ResilienceCallback, for the relaunch test:

    torchrun --nproc-per-node 4 --max-restarts 1 tests/python/trainer_run.py --output-dir D

GPT-2 (from a config) fine-tuned on random tokens; a weight of rank 1's block 0 is scaled from
--fault-step until a recovery. Certification detects it, every rank leaves with exit status 75,
torchrun relaunches, and the script resumes from trusted_checkpoint(D). Rank 0 writes what each
attempt saw to D/attempt-<n>.json (the checks' results as they arrive) and D/summary.json;
every rank its injection records to D/attempt-<n>/."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.distributed as dist  # noqa: E402

import lm_resiliency as lmr  # noqa: E402
import trainer_workers as tw  # noqa: E402
from lm_resiliency.integrations.hf import ResilienceCallback, trusted_checkpoint  # noqa: E402
from lm_resiliency.recovery import init_process_group  # noqa: E402
from lm_resiliency.scout import ReplayHarnessConfig  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", required=True)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--fault-step", type=int, default=9)
    p.add_argument("--campaign", choices=["until-recovery", "four"], default="until-recovery",
                   help="four: block-output, gradient and weight SDC and a compute delay (trainer_workers)")
    p.add_argument("--self-healing", type=int, default=1)
    p.add_argument("--check-interval", type=int, default=2)
    p.add_argument("--accumulate", type=int, default=1)
    args = p.parse_args()
    init_process_group("gloo")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    seen = {"attempt": attempt, "resume_from": trusted_checkpoint(args.output_dir), "results": []}
    log = os.path.join(args.output_dir, f"attempt-{attempt}.json")

    def note(result):
        if dist.get_rank() == 0:
            seen["results"].append(result.to_dict())
            with open(log, "w", encoding="utf-8") as f:
                json.dump(seen, f)

    # One optimizer slice: a catalog cycle is two checks, so the first capture is verified by step 8.
    campaign = tw.until_recovery(args.fault_step) if args.campaign == "until-recovery" else tw.four_campaign()
    resilience = ResilienceCallback(replay=ReplayHarnessConfig(check_interval=args.check_interval,
                                                               optimizer_slice_size=32),
                                    hangs=False, campaign=campaign, self_healing=bool(args.self_healing),
                                    hooks=lmr.OrchestrationHooks(on_replay_result=note))
    grab = tw.Grab(resilience, artifacts=os.path.join(args.output_dir, f"attempt-{attempt}"))
    trainer = tw.make_trainer(args.output_dir, args.steps, args.accumulate, callbacks=[grab.callback, resilience])
    try:
        trainer.train(resume_from_checkpoint=seen["resume_from"])
    except SystemExit:  # leaving for the relaunch: this attempt's injection records first
        grab.write()
        raise
    if dist.get_rank() == 0:
        summary = {**grab.out, "global_step": trainer.state.global_step, "attempt": attempt,
                   "resume_from": seen["resume_from"], "listing": sorted(os.listdir(args.output_dir)),
                   "certified": sorted(os.listdir(os.path.join(args.output_dir, "lmr-checkpoints")))}
        with open(os.path.join(args.output_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
