"""TorchTitan with LM Resiliency, without editing the Trainer: ``lmr-torchtitan`` takes
TorchTitan's own command line plus ``--lmr-*`` options, builds the Trainer as
``torchtitan.train`` does, and turns on SCOUT, a fault campaign and checkpoint
certification around ``trainer.train()``:

    torchrun --nproc-per-node 4 -m lm_resiliency.frameworks.torchtitan_run \\
        --lmr-check-interval 10 --lmr-campaign campaign.json --lmr-artifacts out/ \\
        --module torchtitan.models.llama3 --config llama3_8b --checkpoint.enable ...

In Python, ``instrument(trainer, ...)`` does the same for a Trainer you built. Everything
starts when the Trainer loads its checkpoint (the first thing ``train()`` does), so the
campaign clock and the replay harness count from the step TorchTitan resumed at; with
``certify=`` a restarted job resumes from the newest trusted checkpoint instead of
TorchTitan's latest.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any, Optional

import torch.distributed as dist

from lm_resiliency.agree import gather
from lm_resiliency.checkpoint.backends import durable_checkpoints
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.torchtitan_checkpoint import STATE_KEY, ResilienceState

__all__ = ["Instrumented", "cli", "instrument", "main"]

log = logging.getLogger("lm_resiliency.torchtitan")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _saved_keys(path: str) -> Optional[set]:
    """The top-level keys of the DCP checkpoint at `path`, or None when it has none."""
    import torch.distributed.checkpoint as dcp

    if not os.path.isfile(os.path.join(path, ".metadata")):
        return None
    metadata = dcp.FileSystemReader(path).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


class Instrumented:
    """What ``instrument`` turned on for one Trainer: ``harness``, ``session`` and
    ``certifier`` (None until the Trainer's checkpoint load, or when not asked for)."""

    def __init__(self, trainer: Any, check_interval: int, state_integrity: Optional[bool], campaign: Any,
                 certify: Optional[str], harness_options: dict[str, Any]) -> None:
        from lm_resiliency.fault_injection import MemoryCampaignStateStore

        self.trainer = trainer
        self.check_interval = check_interval
        self.state_integrity = state_integrity
        self.campaign = campaign
        self.harness_options = harness_options
        self.durable = durable_checkpoints(trainer, None, certify) if certify else None
        self.harness: Any = None
        self.session: Any = None
        self.certifier: Any = None
        self.resumed: Any = None
        self.started = False
        self._store = MemoryCampaignStateStore()
        manager = trainer.checkpointer
        self.state = ResilienceState(_rank(), journal=self._journal, completed=lambda: int(trainer.step))
        if getattr(manager, "enable", False):
            manager.states[STATE_KEY] = self.state
        self._load = manager.load
        manager.load = self._on_load  # train() calls it first: everything starts there

    def _journal(self) -> Optional[str]:
        journal = self._store.load()
        return None if journal is None else json.dumps(journal)

    def _torchtitan_load(self, *args: Any, **kwargs: Any) -> Any:
        """TorchTitan's own load, leaving our state out when the checkpoint it picks was
        written without it (a plain TorchTitan checkpoint)."""
        manager = self.trainer.checkpointer
        if not getattr(manager, "enable", False):
            return self._load(*args, **kwargs)
        step = kwargs.get("step", args[0] if args else -1)
        step = manager._find_load_step() if step == -1 else step
        keys = _saved_keys(manager._create_checkpoint_id(step)) if step >= 0 else None
        if keys is None or STATE_KEY in keys:
            return self._load(*args, **kwargs)
        state = manager.states.pop(STATE_KEY)
        try:
            return self._load(*args, **kwargs)
        finally:
            manager.states[STATE_KEY] = state

    def _on_load(self, *args: Any, **kwargs: Any) -> Any:
        if self.started:
            return self._load(*args, **kwargs)
        loaded: Any = False
        if self.durable is not None:
            from lm_resiliency.recovery import resume

            self.resumed = resume(self.durable, self.trainer, None)
        if self.resumed is None:
            loaded = self._torchtitan_load(*args, **kwargs)
        else:
            log.warning("resumed from the trusted checkpoint %s (step %d); TorchTitan's own load was skipped",
                        self.resumed.decision.checkpoint_id, self.resumed.step)
            loaded = True
        self._start()
        return loaded

    def _start(self) -> None:
        from lm_resiliency.checkpoint import CheckpointCertifier
        from lm_resiliency.fault_injection import enable_fault_injection
        from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig

        self.started = True
        completed = int(self.trainer.step)
        saved = self.state.loaded
        if saved is not None:
            if saved.get("completed_iterations") != completed:
                log.warning("the checkpoint's campaign clock says %s completed iterations, the Trainer %d",
                            saved.get("completed_iterations"), completed)
            if saved.get("journal") and self._store.load() is None:
                self._store.compare_and_swap(None, json.loads(saved["journal"]))
        if self.check_interval > 0:
            config = ReplayHarnessConfig(check_interval=self.check_interval, state_integrity=self.state_integrity,
                                         **self.harness_options)
            self.harness = ReplayHarness(self.trainer, config=config, completed_iterations=completed)
        if self.campaign is not None:
            self.session = enable_fault_injection(self.trainer, campaign=self.campaign, state_store=self._store,
                                                  completed_iterations=completed)
            if self.resumed is not None:
                self.session.notify_recovery()
        if self.durable is not None and self.harness is not None:
            self.certifier = CheckpointCertifier(self.harness, self.durable)

    def write_artifacts(self, directory: str) -> None:
        """Collective. Each rank's injection record (``injections-rank-R.json``) and, on
        rank 0, ``localization.json`` from the checks of every group of replay peers and
        every rank's records: the inputs of ``lmr campaign compare``."""
        from lm_resiliency import _core
        from lm_resiliency.fault_injection import FaultInjectionRecord
        from lm_resiliency.fault_injection.ground_truth import write_localization_artifact
        from lm_resiliency.scout import localization_results
        from lm_resiliency.scout.result import ReplayResult

        os.makedirs(directory, exist_ok=True)
        rank = _rank()
        if self.session is not None:
            self.session.write_artifact(os.path.join(directory, f"injections-rank-{rank}.json"))
        mine = {"records": [r.to_dict() for r in self.session.records()] if self.session else [],
                "results": [r.to_dict() for r in self.harness.results] if self.harness else [],
                "times": dict(self.harness.boundary_times) if self.harness else {}}
        everyone = gather(mine)
        world = len(everyone)
        if rank != 0 or self.session is None or self.harness is None:
            return
        groups = _core.mesh_compute_groups(self.harness._adapter.mesh_dims(world), world)
        results = [ReplayResult.from_dict(r) for g in groups for r in everyone[min(g)]["results"]]
        records = [FaultInjectionRecord.from_dict(r) for out in everyone for r in out["records"]]
        located = localization_results(self.session.campaign, records, results, everyone[0]["times"])
        write_localization_artifact(os.path.join(directory, "localization.json"), located)

    def close(self) -> None:
        for part in (self.session, self.certifier, self.harness):
            if part is not None:
                part.close()
        self.trainer.checkpointer.load = self._load


def instrument(trainer: Any, *, check_interval: int = 100, state_integrity: Optional[bool] = None,
               campaign: Any = None, certify: Optional[str] = None, **harness_options: Any) -> Instrumented:
    """Turns LM Resiliency on for a TorchTitan Trainer, before ``trainer.train()``:
    SCOUT every `check_interval` steps (0: off), the fault `campaign` (a FaultCampaign,
    its JSON or a path), and with `certify` (a directory) certified checkpoints of
    TorchTitan's states and recovery from the newest trusted one. `harness_options`:
    ReplayHarnessConfig's other fields."""
    if not isinstance(check_interval, int) or isinstance(check_interval, bool) or check_interval < 0:
        raise InvalidArgumentError(f"check_interval must be an int >= 0, got {check_interval!r}")
    if certify and check_interval == 0:
        raise InvalidArgumentError("certify needs SCOUT checks (check_interval > 0): they certify the checkpoints")
    return Instrumented(trainer, check_interval, state_integrity, campaign, certify, harness_options)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lmr-torchtitan", add_help=False,
                                description="TorchTitan's train entry point with LM Resiliency. Options other than "
                                            "--lmr-* go to TorchTitan.")
    p.add_argument("--lmr-check-interval", type=int, default=100, help="SCOUT every N steps (0: off)")
    p.add_argument("--lmr-state-integrity", choices=("on", "off", "auto"), default="auto",
                   help="state integrity after every update (auto: on for CUDA with peers)")
    p.add_argument("--lmr-campaign", help="a fault campaign (JSON file) to run")
    p.add_argument("--lmr-certify", help="directory of certified checkpoints and the trust manifest")
    p.add_argument("--lmr-artifacts", help="write injection records and localization.json here at the end")
    p.add_argument("--lmr-help", action="help", help="this help")
    return p


def main(argv: Optional[list[str]] = None, build: Any = None) -> Any:
    """The command line. `build(torchtitan_argv)` makes the Trainer (default: TorchTitan's
    ConfigManager, as torchtitan.train does); returns the Instrumented job."""
    args, rest = _parser().parse_known_args(argv)
    if build is None:
        from torchtitan.config import ConfigManager
        from torchtitan.tools.logging import init_logger

        init_logger()

        def build(argv: list[str]) -> Any:
            return ConfigManager().parse_args(argv).build()

    trainer = build(rest)
    integrity = {"on": True, "off": False, "auto": None}[args.lmr_state_integrity]
    job = instrument(trainer, check_interval=args.lmr_check_interval, state_integrity=integrity,
                     campaign=args.lmr_campaign, certify=args.lmr_certify)
    try:
        trainer.train()
        if args.lmr_artifacts:
            job.write_artifacts(args.lmr_artifacts)
    finally:
        job.close()
        trainer.close()
    return job


def cli() -> None:
    """``lmr-torchtitan`` (and ``python -m lm_resiliency.frameworks.torchtitan_run``)."""
    main()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    cli()
