"""The fault families a qualification run injects, and the default campaign built from them.

Each family is one incident of the campaign: what it injects, on which rank, for how long,
and what the run's configuration needs for it to be localized (a family the configuration
cannot localize is left out of the default campaign, with the reason printed). The
schedule puts the permanent faults first, once a verified checkpoint exists, so the
recoveries happen early and every other family runs in the resumed generation,
each in its own window with fault-free iterations between them. On several nodes the
broken node's fault comes first: it recurs after the rollback, the node is excluded, and
the later families run on the world without it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

# Stall lengths: long enough to pass the out-of-band threshold and be agreed, short enough
# for the run to go on afterwards.
STALL_S = 4.0
HANG_THRESHOLD_S = 1.5
DESYNC_S = 4.0
LATEST_INTERVAL = 3  # fast-tier snapshots: a checkpoint write at least this often
RECOVERY_AT = 12  # the permanent fault: after two catalog cycles have verified a checkpoint
GAP = 3  # fault-free iterations between two windows


@dataclasses.dataclass(frozen=True)
class Config:
    """What the run is: the facts a family's requirement depends on."""

    parallel: str  # ddp | fsdp2 | hsdp
    world: int
    device: str = "cpu"
    dp_replicate: int = 2
    host: str = "localhost"  # the host every rank runs on (the comm straggler's resource)
    nodes: int = 1  # torchrun agents, each a node with its own LMR_NODE_ID (node_name(i))
    standby: int = 0  # spare agents waiting to take an excluded node's place

    @property
    def replicas(self) -> int:
        """Copies of each piece of held state (parameters, optimizer state)."""
        return {"ddp": self.world, "fsdp2": 1, "hsdp": self.dp_replicate}[self.parallel]

    @property
    def per_node(self) -> int:
        return self.world // self.nodes

    @property
    def after_exclusion(self) -> int:
        """The world once the broken node left: a standby keeps it, else it shrinks by a node."""
        return self.world if self.standby or self.nodes < 2 else self.world - self.per_node


def node_name(i: int) -> str:
    """The node identity of agent i (node-a, node-b, ...); spares are spare-1, spare-2, ..."""
    return f"node-{chr(ord('a') + i)}"


BROKEN_NODE = node_name(1)  # where the broken_node family's fault lives


def _fault(fault_type: str, target: dict, parameters: Optional[dict] = None) -> dict:
    return {"fault_id": "f", "type": fault_type, "target": target, "parameters": parameters or {}}


def _block(rank: int, surface: str, index: int = 0) -> dict:
    return {"rank": rank, "component": "transformer_block", "index": index, "surface": surface}


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    title: str
    window: int  # iterations the incident is active
    faults: Callable[[int, Config], list]  # (rank, config) -> the incident's faults
    needs: Callable[[Config], str] = lambda c: ""  # why `c` cannot localize it ("" when it can)
    until: str = ""  # a lifetime "until" instead of `window` iterations
    retrigger: str = ""  # "every_attempt": the fault comes back after every recovery

    def incident(self, at: int, rank: int, config: Config) -> dict:
        lifetime: dict[str, Any] = {"until": self.until} if self.until else {"iterations": self.window}
        incident = {"incident_id": self.name, "trigger": {"at": [at]}, "lifetime": lifetime,
                    "faults": self.faults(rank, config)}
        if self.retrigger:
            incident["retrigger"] = self.retrigger
        return incident


def _majority(c: Config) -> str:
    return "" if c.world >= 3 else f"needs 3 or more data-parallel ranks for a strict majority (world {c.world})"


def _held_state(c: Config) -> str:
    if c.world < 2:
        return "needs a second rank: one rank has nobody to compare with"
    return ""


def _mesh(c: Config) -> str:
    if c.parallel != "hsdp" or c.world < 4 or c.world // c.dp_replicate < 2:
        return ("needs two process-group dimensions to tell a slow link from a slow group "
                "(--parallel hsdp on 4 or more ranks); under DDP or FSDP2 every collective runs on one group")
    return ""


def _nodes(c: Config) -> str:
    if c.nodes < 2:
        return ("needs 2 or more nodes (--nodes N: N torchrun agents on one rendezvous, each with its own "
                "node identity) so the broken one can leave")
    if c.after_exclusion < 3:
        return (f"needs 3 or more ranks once the broken node left, for a strict majority ({c.after_exclusion}): "
                "more ranks per node, another node or --standby 1")
    return ""


def _broken_node(rank: int, c: Config) -> list:
    """A weight SDC on the broken node's local rank `rank % per_node`, wherever the job puts
    that node's ranks; retriggered after every recovery, it is gone once the node is excluded."""
    target = {"host": BROKEN_NODE, "local_rank": rank % c.per_node, "component": "transformer_block", "index": 0,
              "surface": "weight"}
    return [_fault("tensor_corruption", target,
                   {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "attention.wq.weight"})]


FAMILIES: tuple[Family, ...] = (
    Family("broken_node", "broken node (recurring SDC): rollback, then exclusion", 0, _broken_node, _nodes,
           until="recovery", retrigger="every_attempt"),
    Family("recovery", "permanent weight SDC, rollback", 0,
           lambda r, c: [_fault("tensor_corruption", _block(r, "weight"),
                                {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "attention.wq.weight"})],
           _held_state, until="recovery"),
    Family("dataloader_stall", "DataLoader stall", 1,
           lambda r, c: [_fault("hang", {"rank": r, "surface": "data"}, {"seconds": STALL_S})], _held_state),
    Family("checkpoint_stall", "checkpoint I/O stall", LATEST_INTERVAL + 1,
           lambda r, c: [_fault("hang", {"rank": r, "surface": "checkpoint"}, {"seconds": STALL_S})], _held_state),
    Family("process_stall", "process stall", 1,
           lambda r, c: [_fault("hang", {"rank": r, "surface": "process"}, {"seconds": STALL_S})], _majority),
    Family("collective_desync", "collective desync", 1,
           lambda r, c: [_fault("collective_desync", {"rank": r, "surface": "collective"}, {"seconds": DESYNC_S})],
           _majority),
    Family("compute_straggler", "compute straggler", 8,
           lambda r, c: [_fault("delay", _block(r, "compute"), {"delay_ms": 40})], _majority),
    Family("comm_straggler", "communication straggler (slow link)", 8,
           lambda r, c: [_fault("delay", {"rank": r, "surface": "collective", "resource": c.host},
                                {"delay_ms": 60})], _mesh),
    Family("sdc_output", "SDC in a block's output", 4,
           lambda r, c: [_fault("tensor_corruption", _block(r, "output", 1), {"operation": "sign_flip", "scope": "row"})],
           _majority),
    Family("sdc_gradient", "SDC in a gradient", 4,
           lambda r, c: [_fault("tensor_corruption", _block(r, "gradient"),
                                {"operation": "noise", "std": 1.0, "scope": "1%", "parameter": "feed_forward.w2.weight"})],
           _majority),
    Family("sdc_embedding", "SDC in the embedding", 4,
           lambda r, c: [_fault("tensor_corruption", {"rank": r, "component": "embedding", "surface": "output"},
                                {"operation": "scale", "factor": 3.0, "scope": "row"})], _majority),
    Family("sdc_head", "SDC in the output head", 4,
           lambda r, c: [_fault("tensor_corruption", {"rank": r, "component": "output", "surface": "output"},
                                {"operation": "single_bitflip", "magnitude": "large", "scope": "1%"})], _majority),
    Family("sdc_optimizer_state", "SDC in optimizer state", 4,
           lambda r, c: [_fault("tensor_corruption", _block(r, "optimizer_state", 0),
                                {"operation": "scale", "factor": 8.0, "scope": "10%", "parameter": "attention.wo.weight",
                                 "state_key": "exp_avg"})], _held_state),
    Family("sdc_weight", "SDC in a weight", 4,
           lambda r, c: [_fault("tensor_corruption", _block(r, "weight", 1),
                                {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "feed_forward.w1.weight"})],
           _held_state),
)
BY_NAME = {f.name: f for f in FAMILIES}
NAMES = tuple(BY_NAME)


def parse_families(text: Optional[str]) -> tuple[str, ...]:
    """Family names from a comma-separated list (None: all), in catalog order; ValueError
    naming an unknown one."""
    if text is None:
        return NAMES
    asked = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in asked if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown family {unknown[0]!r} (known: {', '.join(NAMES)})")
    if not asked:
        raise ValueError("--families names no family")
    return tuple(n for n in NAMES if n in asked)


@dataclasses.dataclass
class Plan:
    campaign: dict
    steps: int  # optimizer steps the run trains for
    left_out: dict[str, str]  # family -> why this configuration cannot localize it


def default_campaign(config: Config, families: tuple[str, ...] = NAMES, seed: int = 20261202) -> Plan:
    """The built-in campaign for `config`: the families it can localize, scheduled one after
    the other; ranks rotate (1, 2, 3, 0, ...) so that each family lands somewhere else."""
    incidents, left_out = [], {}
    at = RECOVERY_AT
    chosen = [BY_NAME[n] for n in families]
    if "recovery" not in families and "broken_node" not in families:
        at = 4  # nothing needs a verified checkpoint first
    world = config.world
    for family in chosen:
        why = family.needs(config)
        if why:
            left_out[family.name] = why
            continue
        rank = (len(incidents) + 1) % world
        if family.name == "broken_node":
            world = config.after_exclusion  # every later family runs on the world without it
        incidents.append(family.incident(at, rank, config))
        # The permanent fault ends at the rollback: the resumed run starts below it.
        at += (1 if family.until else family.window) + GAP
    campaign = {"schema_version": 1, "name": f"qualify-{config.parallel}-{config.world}", "seed": seed,
                "incidents": incidents}
    return Plan(campaign, at + GAP, left_out)


def clean_campaign(seed: int) -> dict:
    """A fault-free run's campaign: its one candidate has probability 0, so the kit runs
    (sessions, journals, records: one skipped candidate) and injects nothing."""
    return {"schema_version": 1, "name": "qualify-clean", "seed": seed, "incidents": [{
        "incident_id": "none", "trigger": {"at": [1], "probability": 0.0}, "lifetime": {"iterations": 1},
        "faults": [_fault("delay", _block(0, "compute"), {"delay_ms": 1})]}]}
