"""The module recipes of a replay check (embedding, a hidden layer, the output head): one
source peer's captured inputs and parameters are broadcast, every peer replays the module's
forward and backward on isolated copies, and the fingerprints are compared.

A recipe has three parts. ``prepare`` is local and runs before the readiness vote, so a
failure there (an argument that cannot be isolated, say) makes the recipe not ready on
every peer. ``run`` then enters the recipe's collectives in the same order on every peer,
whatever happens locally: the local work between them (fingerprints, the replay itself)
runs inside ``guard(recipe)``, which keeps the first error for the check's final vote
instead of raising.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from lm_resiliency import _core
from lm_resiliency.common import REPLAY_COPY
from lm_resiliency.frameworks import FrameworkAdapter
from lm_resiliency.scout.arguments import leaves, map_tensors
from lm_resiliency.scout.broadcast import broadcast_flat
from lm_resiliency.scout.capture import Capture
from lm_resiliency.scout.collective_wait import blocked_in_collectives
from lm_resiliency.scout.determinism import Determinism
from lm_resiliency.scout.fingerprints import fingerprint
from lm_resiliency.scout.module_call import call_with_hooks, first_tensor, swapped_parameters
from lm_resiliency.scout.result import ReplayResult
from lm_resiliency.scout.timing import Timer


@dataclasses.dataclass
class Prepared:
    """What a module recipe replays, checked locally before the readiness vote."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    inputs: list  # the captured tensors, broadcast from the source
    parameters: list  # (name relative to the module, parameter)

    def contract(self) -> list[str]:
        return ([f"{t.dtype}{list(t.shape)}" for t in self.inputs]
                + [f"{n}:{p.dtype}{list(p.shape)}" for n, p in self.parameters])


class ModuleReplay:
    def __init__(self, adapter: FrameworkAdapter, peers: Any, pipelined: bool, device: torch.device,
                 determinism: Determinism, compare_parameters: bool, repeats: int, replaying: list) -> None:
        self._adapter = adapter
        self._peers = peers
        self._pipelined = pipelined
        self._device = device
        self._determinism = determinism
        self._compare_parameters = compare_parameters
        self._repeats = repeats
        self._replaying = replaying  # shared with the captures: replay calls are not captured

    def prepare(self, module: torch.nn.Module, capture: Capture) -> Prepared:
        return Prepared(module, capture.args, capture.kwargs, capture.inputs(), list(module.named_parameters()))

    def run(self, recipe: str, prep: Prepared, step: int, surfaces: dict[str, Any], result: ReplayResult,
            guard: Callable, derived: Optional[Callable[[torch.Tensor], dict[str, torch.Tensor]]] = None,
            verify: bool = False) -> None:
        """`derived(output)`: more surfaces computed from the replayed output (a router's top-k
        decisions), named ``<recipe>.<key>``. `verify`: replay at least twice and raise when
        the output (and derived tensors) differ between the first and the last run."""
        source = _core.replay_source_rank(self._peers.ranks, step)
        # A sharded activation (tensor parallel) is this rank's part: peers of one
        # tensor-parallel coordinate hold the same part of the source's input.
        inputs = [self._adapter.local(x) for x in prep.inputs]
        t = Timer(self._pipelined)
        with t(self._device):
            if self._peers.data is not None:
                broadcast_flat(inputs, source, self._peers.data)
        result.add_collective("broadcast_inputs", recipe, t)
        seed = _core.replay_seed(recipe, step)
        with guard(recipe):
            surfaces[f"{recipe}.invocation"] = fingerprint(inputs, self._pipelined, seed.to_bytes(8, "little"))

        # Parameters: the evidence each peer holds, and full tensors to run with.
        gather = Timer(self._pipelined)
        gathered = False
        full: dict[str, torch.Tensor] = {}
        evidence: list[torch.Tensor] = []
        wraps: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}  # tensor-parallel parts
        for name, p in prep.parameters:
            if not self._adapter.is_sharded(p):
                full[name] = p.detach().clone()
                evidence.append(full[name])
                continue
            gathered = True
            with gather(self._device):
                # Under tensor (expert) parallelism, what this rank's coordinate computes with.
                part = self._adapter.model_parallel_part(p)
                if part is None:
                    full[name] = self._adapter.full_copy(p)
            if part is not None:
                full[name], wraps[name] = part.local, part.wrap
                evidence.append(part.local)
            else:
                evidence.append(full[name] if self._peers.materialize else self._adapter.local(p).detach())
        if gathered:
            result.add_collective("fsdp_parameter_all_gather", recipe, gather)
        if self._compare_parameters:
            with guard(recipe):
                # Copied when pipelined: live shards change with training, and the full
                # copies are overwritten with the source's values just below.
                surfaces[f"{recipe}.params"] = fingerprint(evidence, self._pipelined, live=True)
        # Compute is replayed with the source's parameters too, so a peer whose state
        # diverged (a separate, state-surface finding) does not mask a compute fault.
        t = Timer(self._pipelined)
        with t(self._device):
            if self._peers.data is not None:
                broadcast_flat(list(full.values()), source, self._peers.data)
        result.add_collective("broadcast_parameters", recipe, t)
        with guard(recipe):
            # The dtype the framework computes in (FSDP2 mixed precision casts the gathered
            # parameters), after the broadcast: the source's values, cast alike everywhere.
            for name, p in prep.parameters:
                dtype = self._adapter.compute_dtype(p)
                if dtype is not None:
                    full[name] = full[name].to(dtype)
                if name in wraps:
                    full[name] = wraps[name](full[name])
            self._replay(recipe, prep, full, seed, surfaces, result, derived, verify)

    def _replay(self, recipe: str, prep: Prepared, full: dict[str, torch.Tensor], seed: int,
                surfaces: dict[str, Any], result: ReplayResult,
                derived: Optional[Callable[[torch.Tensor], dict[str, torch.Tensor]]] = None,
                verify: bool = False) -> None:
        """Forward and backward `repeats` times on fresh copies (purely local); the last
        repetition's values are fingerprinted, every repetition is timed."""
        def fresh(t: torch.Tensor) -> torch.Tensor:
            c = t.detach().clone()
            return c.requires_grad_(True) if c.is_floating_point() else c

        outcome: list = []

        def replay() -> None:  # may run twice (see Determinism)
            outcome.clear()
            leaves_ = {n: v.requires_grad_(v.is_floating_point()) for n, v in full.items()}
            for v in leaves_.values():
                v.grad = None
                setattr(v, REPLAY_COPY, True)
            r_args, r_kwargs = map_tensors(prep.args, fresh, "args"), map_tensors(prep.kwargs, fresh, "kwargs")
            inputs = [x for x in leaves((r_args, r_kwargs)) if x.is_floating_point()]  # before the call adds any
            with swapped_parameters(prep.module, leaves_), torch.enable_grad():
                out = first_tensor(call_with_hooks(prep.module, r_args, r_kwargs, self._adapter.is_framework_hook))
                local_out = self._adapter.local(out)
                grad_out = self._adapter.with_local(out, torch.randn(local_out.shape, dtype=out.dtype,
                                                                      device=out.device))
                if out.requires_grad:
                    torch.autograd.backward(out, grad_out)
            extra = derived(out.detach()) if derived is not None else {}
            local = self._adapter.local
            outcome.extend([local(out.detach()), [None if x.grad is None else local(x.grad) for x in inputs],
                            [None if v.grad is None else local(v.grad) for v in leaves_.values()], extra])

        timers = []
        first: list = []
        self._replaying[0] = True
        try:
            for _ in range(max(self._repeats, 2 if verify else 1)):
                if verify and outcome and not first:
                    first.extend([outcome[0].detach().clone(), {k: v.clone() for k, v in outcome[3].items()}])
                timer = Timer(self._pipelined)
                # A block's own collectives (tensor, context or expert parallel): the time
                # this rank waits there for a slower partner is not its compute time.
                with blocked_in_collectives() as blocked, timer(self._device):
                    self._determinism.run(recipe, seed, replay)
                timer.exclude(blocked[0])
                timers.append(timer)
        finally:
            self._replaying[0] = False
        result.compute_repetitions[recipe] = timers
        out, input_grads, param_grads, extra = outcome
        if first and not (torch.equal(first[0], out.detach()) and all(torch.equal(first[1][k], v) for k, v in extra.items())):
            raise RuntimeError(f"{recipe} replay is not deterministic: two runs on the same inputs differ")
        for key, value in extra.items():
            surfaces[f"{recipe}.{key}"] = fingerprint([value], self._pipelined)
        surfaces[f"{recipe}.output"] = fingerprint([out], self._pipelined)
        surfaces[f"{recipe}.input_grad"] = fingerprint(input_grads, self._pipelined)
        surfaces[f"{recipe}.param_grad"] = fingerprint(param_grads, self._pipelined)
