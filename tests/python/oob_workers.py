"""One rank of an out-of-band hang test, run as its own process (as torchrun would):

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python oob_workers.py SCENARIO STATE_DIR OUT_DIR

Scenarios: healthy, desync, sleep (a kit `hang` fault through a CallbackFaultExecutor),
sigstop (the test stops a rank), dataloader, checkpoint, common, daemon_kill. Each rank
appends the reports its OrchestrationHooks receive to OUT_DIR/reports-<rank>.jsonl and
writes OUT_DIR/info-<rank>.json (pids, injected occurrence) and OUT_DIR/step-<rank>.
"""

import faulthandler
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lm_resiliency as lmr
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.scout import HangDetectionConfig, HangMonitor, checkpoint_io, instrument_dataloader
from lm_resiliency.workloads import SyntheticTokens, TrainConfig, build
from lm_resiliency.workloads.model import DecoderConfig

STALL_STEP = 5
HANG_S = 600  # longer than any test: the test ends the processes


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


class Batches:
    """The rank's shard of the synthetic data; the dataloader scenario's rank 3 stalls."""

    def __init__(self, data, rank, steps, stall):
        self.data, self.rank, self.steps, self.stall = data, rank, steps, stall

    def __iter__(self):
        for step in range(self.steps):
            if self.stall and step == STALL_STEP:
                time.sleep(HANG_S)
            yield self.data.batch(step, shard=self.rank)

    def __len__(self):
        return self.steps


def hang_campaign():
    return {"schema_version": 1, "name": "oob-hang", "seed": 7, "incidents": [{
        "incident_id": "stall-rank1", "trigger": {"at": [STALL_STEP]}, "lifetime": {"iterations": 1},
        "faults": [{"fault_id": "sleep", "type": "hang", "target": {"rank": 1, "surface": "process"},
                    "parameters": {"seconds": HANG_S}}]}]}


def main():
    scenario, state_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
    steps = int(os.environ.get("OOB_STEPS", "40"))
    threshold = float(os.environ.get("OOB_THRESHOLD_S", "1.5"))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand, for debugging a test
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=HANG_S))
    rank = dist.get_rank()
    parallel = os.environ.get("OOB_PARALLEL", "ddp")
    engine = trainer = None
    if parallel == "torchtitan":  # TorchTitan's real Trainer (torchtitan_cpu.py), trained step by step
        import torchtitan_cpu

        trainer = torchtitan_cpu.build_trainer(["--training.steps", str(steps + 1), "--dump_folder",
                                                os.path.join(out, f"tt-{rank}")])
        model, opt, data = trainer, None, SyntheticTokens(64, 16, 2)
        batches = trainer.batch_generator(trainer.dataloader)
    elif parallel.startswith("zero"):  # a DeepSpeed engine (deepspeed_workers.py) under ZeRO stage N
        import deepspeed_workers

        engine = deepspeed_workers.build(int(parallel[4:]))
        model, opt = engine, None
        data = SyntheticTokens(deepspeed_workers.VOCAB, 16, 2)
    else:
        cfg = TrainConfig(parallel=parallel, steps=steps, batch_size=2, seq_len=16,
                          model=DecoderConfig(dim=32, n_layers=2, n_heads=2, ffn_hidden=64, max_seq_len=32))
        model, opt, data, device = build(cfg)
    reports_path = os.path.join(out, f"reports-{rank}.jsonl")

    def on_report(report):
        with open(reports_path, "a") as f:
            f.write(json.dumps(report.to_dict()) + "\n")

    warmup = float(os.environ.get("OOB_WARMUP_THRESHOLD_S", "600"))
    config = HangDetectionConfig(threshold_s=threshold, warmup_threshold_s=warmup, poll_s=0.05, join_s=1.0, gather_s=2.0, io_absolute_s=1.0,
                                 io_relative=4.0, io_persistence_s=0.5, hang_state_dir=state_dir,
                                 run_id=os.environ.get("OOB_RUN_ID"),
                                 hang_master_port=int(os.environ["OOB_PORT"]) if "OOB_PORT" in os.environ else None)
    monitor = HangMonitor(model, opt, config, OrchestrationHooks(on_fault_report=on_report))
    info = {"pid": os.getpid(), "daemon": monitor.daemon_pid}

    session = None
    if scenario == "sleep":
        def activate(request):
            seconds = request.parameters["seconds"]
            def stall():
                write_json(os.path.join(out, f"stall-start-{rank}"), time.time())
                time.sleep(seconds)

            request.on_next_step(stall)
            info["occurrence_id"] = request.occurrence_id
            write_json(os.path.join(out, f"info-{rank}.json"), info)
            return lmr.FaultExecutionResult(verified=True, active=False, evidence={"sleep_s": seconds})

        executor = lmr.CallbackFaultExecutor("sleep", ["hang"], "isolated_destructive", activate, one_shot=True)
        session = lmr.enable_fault_injection(model, opt, campaign=hang_campaign(), executors=[executor])
    write_json(os.path.join(out, f"info-{rank}.json"), info)

    def io_counters():
        with open(f"/proc/{monitor.daemon_pid}/io") as f:
            return dict(line.split(": ") for line in f.read().split("\n") if line)

    before = io_counters() if scenario == "healthy" else None
    loader = instrument_dataloader(Batches(data, rank, steps, stall=scenario == "dataloader" and rank == 3))
    start = time.perf_counter()
    first_step_s = float(os.environ.get("OOB_FIRST_STEP_S", "0"))  # every rank: a compile-like first step
    for step, (inputs, targets) in enumerate(loader):
        if step == 0:
            time.sleep(first_step_s)  # publishes nothing, as a compilation does not
        if trainer is not None:  # its own data; the loader only paces the scenario
            trainer.step += 1
            trainer.train_step(batches)
            loss = torch.zeros(1)
        else:
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            if engine is not None:
                engine.backward(loss)
                engine.step()
            else:
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        stalling = step == STALL_STEP
        if not (scenario == "desync" and rank == 2 and stalling):
            dist.all_reduce(loss.detach())
        if scenario == "checkpoint" and rank == 0 and stalling:
            with checkpoint_io():
                torch.save(model.state_dict(), os.path.join(out, "ckpt.pt"))
                time.sleep(HANG_S)  # the storage stops answering
        if scenario == "sigstop" and rank == 1 and stalling:
            write_json(os.path.join(out, "stop-me"), os.getpid())  # the test SIGSTOPs this process now
            time.sleep(HANG_S)
        if scenario == "common" and stalling:
            # Every rank waits for its neighbour at once: a stall of the whole group.
            t = torch.zeros(1)
            dist.recv(t, src=(rank + 1) % dist.get_world_size())
        with open(os.path.join(out, f"step-{rank}"), "w") as f:
            f.write(str(step))
    elapsed = time.perf_counter() - start
    result = {"steps": steps, "seconds": elapsed}
    if before is not None:
        after = io_counters()
        result["daemon_io_delta"] = {k: int(after[k]) - int(before[k]) for k in before}
    monitor.poll_reports()
    result["reports"] = [r.report_id for r in monitor.reports]
    if session is not None:
        session.close()
    monitor.close()
    dist.destroy_process_group()
    write_json(os.path.join(out, f"done-{rank}.json"), result)


if __name__ == "__main__":
    main()
