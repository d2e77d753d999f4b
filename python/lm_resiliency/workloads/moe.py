"""The reference mixture-of-experts decoder: the llama-style blocks of workloads/model.py whose
MLP is a top-k routed mixture of SwiGLU experts with expert parallelism.

Expert parallelism (EP) splits the experts over an expert-parallel group of ``ep`` ranks: a
rank holds ``num_experts / ep`` of them and exchanges tokens with its group through
``torch.distributed.all_to_all_single`` (dispatch, then combine, after an exchange of the
token counts). The world is ``dp x ep`` with the EP dimension innermost (the ranks of an EP
group are consecutive); the ``dp`` ranks holding the same experts are the experts' data
parallel replicas. Dense parameters are replicated on every rank; the gradients are averaged
by ``sync_gradients`` (dense ones over the world, expert ones over the expert's replicas).

Convention the plain-PyTorch adapter reads (frameworks/pytorch.py): an MoE layer is a module
with ``router`` (logits over ``num_experts``), ``experts`` (the local experts, each called once
per forward, with ``global_expert_index``), ``top_k``, ``num_experts``, ``ep_size``,
``ep_rank`` and ``ep_group``. Here ``experts`` is a ModuleDict keyed by the global expert
index, so every expert has its own name in a state dict (``layers.1.moe.experts.3.w1.weight``)
and a distributed checkpoint saves each expert once, from one of its replicas.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from lm_resiliency.workloads.model import Attention, Decoder, DecoderConfig, RMSNorm


@dataclasses.dataclass
class MoEConfig(DecoderConfig):
    num_experts: int = 4
    top_k: int = 2
    expert_hidden: int = 64
    ep: int = 1  # expert-parallel group size; num_experts must split evenly over it

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_experts < 1 or self.expert_hidden < 1 or self.ep < 1:
            raise ValueError("num_experts, expert_hidden and ep must be >= 1")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, num_experts={self.num_experts}]")
        if self.num_experts % self.ep:
            raise ValueError(f"num_experts={self.num_experts} must split evenly over ep={self.ep}")


class Expert(nn.Module):
    """A SwiGLU MLP; ``global_expert_index`` names it across the expert-parallel group."""

    def __init__(self, dim: int, hidden: int, global_expert_index: int) -> None:
        super().__init__()
        self.global_expert_index = global_expert_index
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Router(nn.Module):
    """Gating logits over the experts (float32, as routers are usually kept)."""

    def __init__(self, dim: int, num_experts: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(x).float()


def top_k_routing(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert indices), each (tokens, k): softmax over the experts, the k largest,
    renormalised. Ties go to the lower index (torch.topk on CPU and CUDA alike, sorted)."""
    probs = logits.softmax(dim=-1)
    weights, indices = probs.topk(k, dim=-1, sorted=True)
    return weights / weights.sum(dim=-1, keepdim=True), indices


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits, differentiable (backward sends the gradient
    back the way the tokens came). Goes through ``torch.distributed.all_to_all_single``, so
    what wraps it (collective timing, hang detection, a fault executor) sees every call."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list, in_splits: list, group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=out_splits, input_split_sizes=in_splits,
                               group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=in_splits, input_split_sizes=out_splits,
                               group=ctx.group)
        return back, None, None, None


class MoELayer(nn.Module):
    """Top-k routed experts; with ``ep_size > 1`` the experts are spread over ``ep_group``."""

    def __init__(self, cfg: MoEConfig, ep_rank: int = 0, ep_group: Any = None) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.ep_size, self.ep_rank = cfg.num_experts, cfg.top_k, cfg.ep, ep_rank
        self.ep_group = ep_group
        self.num_local_experts = cfg.num_experts // cfg.ep
        first = ep_rank * self.num_local_experts
        self.router = Router(cfg.dim, cfg.num_experts)
        self.experts = nn.ModuleDict({str(first + i): Expert(cfg.dim, cfg.expert_hidden, first + i)
                                      for i in range(self.num_local_experts)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, indices = top_k_routing(self.router(tokens), self.top_k)
        flat = indices.reshape(-1)  # (tokens * k) assignments, token-major
        order = torch.argsort(flat, stable=True)
        owner = torch.div(order, self.top_k, rounding_mode="floor")  # the token of each sorted assignment
        counts = torch.bincount(flat, minlength=self.num_experts)  # tokens per global expert
        routed = tokens[owner]
        if self.ep_size > 1:
            routed, local_counts, splits = self._dispatch(routed, counts)
        else:
            local_counts, splits = counts.reshape(1, -1), None
        out = self._run_experts(routed, local_counts)
        if splits is not None:
            out = _AllToAll.apply(out, splits[0], splits[1], self.ep_group)  # back the way it came
        combined = torch.zeros_like(tokens)
        combined.index_add_(0, owner, out * weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype))
        return combined.reshape(shape)

    def _dispatch(self, routed: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """Sends each token to the rank holding its expert; returns the tokens received (by
        source rank, then local expert), their counts (source x local expert) and the splits."""
        per_rank = counts.reshape(self.ep_size, self.num_local_experts)
        received_counts = torch.empty_like(per_rank)
        dist.all_to_all_single(received_counts, per_rank.contiguous(), group=self.ep_group)
        in_splits = per_rank.sum(dim=1).tolist()
        out_splits = received_counts.sum(dim=1).tolist()
        received = _AllToAll.apply(routed, out_splits, in_splits, self.ep_group)
        return received, received_counts, (in_splits, out_splits)

    def _run_experts(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`routed` holds, for each source (row of `counts`), its tokens of each local expert
        in order; every local expert runs once on all of its tokens (possibly none), and the
        outputs go back to the same layout."""
        sources, local = counts.shape
        segments = list(torch.split(routed, counts.reshape(-1).tolist()))
        outputs: list[Optional[torch.Tensor]] = [None] * len(segments)
        for e, expert in enumerate(self.experts.values()):
            mine = [s * local + e for s in range(sources)]
            result = expert(torch.cat([segments[i] for i in mine]))
            for i, part in zip(mine, torch.split(result, [segments[i].shape[0] for i in mine])):
                outputs[i] = part
        return torch.cat(outputs) if outputs else routed


class MoEBlock(nn.Module):
    def __init__(self, cfg: MoEConfig, layer_id: int, ep_rank: int = 0, ep_group: Any = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.moe = MoELayer(cfg, ep_rank, ep_group)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.moe(self.ffn_norm(h))


class MoEDecoder(Decoder):
    """The reference decoder with MoE blocks (``layers[i].layer_id == i``)."""

    def __init__(self, cfg: MoEConfig, ep_rank: int = 0, ep_group: Any = None) -> None:
        super().__init__(cfg, block=lambda c, i: MoEBlock(c, i, ep_rank, ep_group))
        # Each expert from a generator seeded by its layer and global index, so its replicas
        # on other ranks start identical (the dense parameters come from torch's generator,
        # seeded alike on every rank by the caller, as the dense decoder's).
        for block in self.layers:
            for expert in block.moe.experts.values():
                g = torch.Generator().manual_seed(1_000_003 * (block.layer_id + 1) + expert.global_expert_index)
                with torch.no_grad():
                    for p in expert.parameters():
                        p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def expert_parallel_groups(ep: int) -> tuple[Any, Any]:
    """(this rank's expert-parallel group, its expert data-parallel group) for a world of
    ``dp x ep`` ranks, EP innermost. Collective: every rank calls it in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if ep < 1 or world % ep:
        raise ValueError(f"the world of {world} ranks does not split into expert-parallel groups of {ep}")
    mine_ep = mine_dp = None
    for g in range(world // ep):
        ranks = list(range(g * ep, (g + 1) * ep))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine_ep = group
    for e in range(ep):
        ranks = list(range(e, world, ep))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine_dp = group
    return mine_ep, mine_dp


def is_expert_parameter(name: str) -> bool:
    return ".experts." in name


def sync_gradients(model: nn.Module, expert_dp_group: Any) -> None:
    """Averages gradients over the world: dense ones with one all-reduce over every rank,
    expert ones over the expert's data-parallel replicas (they already hold the sum over
    their expert-parallel group's tokens). Collective; call between backward and step."""
    world = dist.get_world_size()
    dense = [p.grad for n, p in model.named_parameters() if p.grad is not None and not is_expert_parameter(n)]
    experts = [p.grad for n, p in model.named_parameters() if p.grad is not None and is_expert_parameter(n)]
    for grads, group in ((dense, None), (experts, expert_dp_group)):
        if not grads:
            continue
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


@dataclasses.dataclass
class MoEJob:
    """A built MoE training job on this rank (``build_moe``)."""

    model: MoEDecoder
    optimizer: torch.optim.Optimizer
    expert_dp_group: Any
    device: torch.device


def build_moe(cfg: MoEConfig, device: Optional[torch.device] = None, lr: float = 3e-3, seed: int = 0) -> MoEJob:
    """The MoE decoder on this rank of a ``dp x ep`` world (collective: creates the groups),
    identically initialised where replicas are, with AdamW."""
    device = device or torch.device("cpu")
    ep_group, dp_group = expert_parallel_groups(cfg.ep) if dist.is_initialized() else (None, None)
    ep_rank = dist.get_rank() % cfg.ep if dist.is_initialized() else 0
    torch.manual_seed(seed)
    model = MoEDecoder(cfg, ep_rank, ep_group).to(device)
    return MoEJob(model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0), dp_group, device)


def moe_step(job: MoEJob, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One optimizer step on this rank's batch; returns the local loss."""
    inputs, targets = inputs.to(job.device), targets.to(job.device)
    logits = job.model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    if dist.is_initialized():
        sync_gradients(job.model, job.expert_dp_group)
    job.optimizer.step()
    job.optimizer.zero_grad(set_to_none=True)
    return loss.detach()
