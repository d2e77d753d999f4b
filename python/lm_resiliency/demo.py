"""``make demo``: four CPU ranks train the reference decoder under DDP (gloo). From a chosen
step on, one rank's copy of one hidden layer silently corrupts one element of its output
(a flipped mantissa bit, as a faulty GPU would). After every optimizer step each rank
replays that layer on the same probe input (broadcast from rank 0) and fingerprints the
output; exact C3 over the four fingerprints names the rank that disagrees. The layer's
parameters are compared too: DDP keeps them identical, so only the replay sees the fault.

Exit status 0 when C3 agreed on every fault-free step and attributed exactly the faulty
rank on every faulty step; 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lm_resiliency.consensus import c3_exact
from lm_resiliency.signature import signature
from lm_resiliency.workloads.launch import spawn
from lm_resiliency.workloads.train import TrainConfig, build, train_step


@dataclass
class DemoConfig:
    world_size: int = 4
    steps: int = 8
    fault_step: int = 4
    fault_rank: int = 2
    layer: int = 1
    element: int = 1234
    bit: int = 20


@dataclass
class StepRecord:
    step: int
    loss: float
    replay_status: str
    replay_ranks: list[int]
    params_status: str


def _flip_bit(t: torch.Tensor, element: int, bit: int) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1).view(torch.int32)
    flat[element % flat.numel()] ^= 1 << bit
    return t


def _params_digest(module: torch.nn.Module) -> bytes:
    return b"".join(signature(p.detach()).digest for p in module.parameters())


def rank_main(cfg: DemoConfig) -> list[StepRecord]:
    train_cfg = TrainConfig(parallel="ddp", steps=cfg.steps)
    model, optimizer, data, device = build(train_cfg)
    decoder = model.module
    layer = decoder.layers[cfg.layer]
    current = {"step": -1}
    if dist.get_rank() == cfg.fault_rank:
        def corrupt(_module, _inputs, output):
            if current["step"] >= cfg.fault_step:
                return _flip_bit(output, cfg.element, cfg.bit)
            return output
        layer.register_forward_hook(corrupt)

    records = []
    for step in range(cfg.steps):
        current["step"] = step
        loss = train_step(model, optimizer, data, device, step)
        dist.all_reduce(loss)
        # Replay the hidden layer on one probe input shared by all ranks.
        probe = torch.empty(2, train_cfg.seq_len, train_cfg.model.dim)
        if dist.get_rank() == 0:
            probe.normal_(generator=torch.Generator().manual_seed(1000 + step))
        dist.broadcast(probe, src=0)
        with torch.no_grad():
            out = layer(probe, decoder.rope_cos, decoder.rope_sin)
        replay = c3_exact(signature(out))
        params = c3_exact(_params_digest(layer))
        records.append(StepRecord(step, loss.item() / dist.get_world_size(), replay.status.name,
                                  list(replay.attributed_ranks), params.status.name))
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lmr-demo", description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=DemoConfig.world_size)
    p.add_argument("--steps", type=int, default=DemoConfig.steps)
    p.add_argument("--fault-step", type=int, default=DemoConfig.fault_step)
    p.add_argument("--fault-rank", type=int, default=DemoConfig.fault_rank)
    p.add_argument("--layer", type=int, default=DemoConfig.layer)
    ns = p.parse_args(argv)
    if ns.world_size < 3:
        p.error("--world-size must be at least 3: two peers cannot outvote each other")
    if not 0 <= ns.fault_rank < ns.world_size:
        p.error(f"--fault-rank must be in [0, {ns.world_size})")
    cfg = DemoConfig(world_size=ns.world_size, steps=ns.steps, fault_step=ns.fault_step,
                     fault_rank=ns.fault_rank, layer=ns.layer)
    print(f"Training the reference decoder: DDP, {cfg.world_size} CPU ranks (gloo), {cfg.steps} steps.")
    print(f"Fault: rank {cfg.fault_rank} flips bit {cfg.bit} of one element of layers[{cfg.layer}]'s output "
          f"from step {cfg.fault_step} on.\n")
    records = spawn(rank_main, cfg.world_size, args=(cfg,))[0]
    print(f"{'step':>4}  {'loss':>7}  {'replay of layers[' + str(cfg.layer) + ']':<28}  layer parameters")
    ok = True
    for r in records:
        verdict = r.replay_status + (f": rank {', '.join(map(str, r.replay_ranks))}" if r.replay_ranks else "")
        print(f"{r.step:>4}  {r.loss:7.4f}  {verdict:<28}  {r.params_status}")
        expected = [cfg.fault_rank] if r.step >= cfg.fault_step else []
        ok = ok and r.replay_ranks == expected and r.params_status == "Agree"
    print()
    if ok:
        print(f"C3 named rank {cfg.fault_rank} on every faulty step and agreed on every clean step.")
        return 0
    print("C3 did not localize the fault as expected.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
