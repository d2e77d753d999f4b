"""What a running qualification shows: a live table (``rich``) on a terminal, plain lines
otherwise. Both are fed the same way: ``update(state)`` with what the run folder says now
(``Tail`` reads it incrementally)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Optional


@dataclasses.dataclass
class RankState:
    step: int = 0
    fired: int = 0
    named: int = 0  # checks and reports that named this rank


@dataclasses.dataclass
class State:
    label: str
    world: int
    steps: int
    generation: int = 0
    ranks: dict[int, RankState] = dataclasses.field(default_factory=dict)
    checks: int = 0
    attributed: int = 0
    reports: int = 0
    decisions: int = 0
    lines: list[str] = dataclasses.field(default_factory=list)  # notable events, oldest first
    last_named: str = ""  # what the previous check named: a repeat is not a new line

    def rank(self, r: int) -> RankState:
        return self.ranks.setdefault(r, RankState())


class Tail:
    """Reads the new lines of a run folder's files since the last call."""

    def __init__(self, run_dir: str, state: State, listener: Any = None) -> None:
        self.run_dir, self.state = run_dir, state
        self.listener = listener  # listener(generation, line) for every new line, when given
        self._offsets: dict[str, int] = {}

    def _new(self, path: str) -> list[dict]:
        try:
            with open(path, encoding="utf-8") as f:
                f.seek(self._offsets.get(path, 0))
                text = f.read()
        except FileNotFoundError:
            return []
        complete = text[: text.rfind("\n") + 1]
        self._offsets[path] = self._offsets.get(path, 0) + len(complete.encode("utf-8"))
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def poll(self) -> None:
        s = self.state
        gens = sorted(int(d[4:]) for d in os.listdir(self.run_dir) if d.startswith("gen-") and d[4:].isdigit()) \
            if os.path.isdir(self.run_dir) else []
        for g in gens:
            gen_dir = os.path.join(self.run_dir, f"gen-{g}")
            s.generation = max(s.generation, g)
            for r in range(s.world):
                for e in self._new(os.path.join(gen_dir, f"progress-rank-{r}.jsonl")):
                    if self.listener is not None:
                        self.listener(g, {**e, "rank": r})
                    if e["type"] == "step":
                        s.rank(r).step, s.rank(r).fired = e["step"], max(s.rank(r).fired, e["fired"])
            for e in self._new(os.path.join(gen_dir, "events.jsonl")):
                if self.listener is not None:
                    self.listener(g, e)
                self._event(g, e)

    def _event(self, g: int, e: dict) -> None:
        s = self.state
        kind = e["type"]
        if kind == "generation" and e.get("resumed_from"):
            s.lines.append(f"generation {g}: resumed from {e['resumed_from']} (step {e['start_step']})")
        elif kind == "result":
            r = e["result"]
            s.checks += 1
            if r["status"] == "Attributed":
                s.attributed += 1
                found = _localization(r)
                for x in sorted({x for entry in found for x in entry["ranks"]}):
                    s.rank(x).named += 1
                what = "; ".join(sorted({f"{entry['kind']} rank {entry['ranks']}" for entry in found}))
                if what != s.last_named:
                    s.lines.append(f"step {r['step']}: {what} (via {', '.join(r['sdc_sources'][:3]) or 'timing'})")
                s.last_named = what
            else:
                s.last_named = ""
        elif kind == "report":
            rep = e["report"]
            s.reports += 1
            for x in rep["ranks"]:
                s.rank(x).named += 1
            s.lines.append(f"step {rep['step'] + 1}: {rep['kind']} rank {rep['ranks']} "
                           f"({rep['detection_latency_s']:.1f} s after the group stopped)")
        elif kind == "decision":
            d = e["decision"]
            s.decisions += 1
            action = d.get("action", "rollback")
            if d.get("blamed_hosts") and action != "rollback":
                action += f" ({', '.join(d['blamed_hosts'])})"
            s.lines.append(f"step {d['decided_at']}: recovery decision {d['mode']}, {action} -> "
                           f"{d.get('checkpoint_id') or '-'}")
        elif kind == "end":
            s.lines.append(f"generation {g} ended: {e['ended']}")


def _localization(result: dict) -> list[dict]:
    from lm_resiliency.scout import ReplayResult

    return ReplayResult.from_dict(result).localization()


class PlainDisplay:
    """One line per notable event, and a progress line every `every_s` seconds."""

    def __init__(self, out: Any = None, every_s: float = 10.0) -> None:
        self.out = out or sys.stdout
        self.every_s = every_s
        self._printed = 0
        self._last = 0.0

    def __enter__(self) -> "PlainDisplay":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, s: State, force: bool = False) -> None:
        for line in s.lines[self._printed:]:
            print(f"  [{s.label}] {line}", file=self.out, flush=True)
        self._printed = len(s.lines)
        now = time.monotonic()
        if force or now - self._last >= self.every_s:
            self._last = now
            steps = " ".join(f"r{r}:{st.step}" for r, st in sorted(s.ranks.items()))
            fired = max((st.fired for st in s.ranks.values()), default=0)
            print(f"  [{s.label}] generation {s.generation}, steps {steps or '-'} of {s.steps}; {fired} fired on the "
                  f"busiest rank, {s.checks} checks, {s.attributed} attributed, {s.reports} stall reports",
                  file=self.out, flush=True)


class RichDisplay:
    """A live table: per rank its step, occurrences fired and times named; the last events."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self._live = Live(console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> "RichDisplay":
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.__exit__(*exc)

    def update(self, s: State, force: bool = False) -> None:
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"{s.label}: generation {s.generation}, {s.checks} checks, {s.attributed} attributed, "
                            f"{s.reports} stall reports, {s.decisions} recovery decisions")
        for column in ("rank", "step", "fired", "named"):
            table.add_column(column, justify="right")
        for r in range(s.world):
            st = s.rank(r)
            table.add_row(str(r), f"{st.step}/{s.steps}", str(st.fired), str(st.named))
        self._live.update(Group(table, *s.lines[-8:]))


def make_display(plain: Optional[bool] = None) -> Any:
    """Rich on a terminal when it is installed, else plain lines."""
    if plain is None:
        plain = not sys.stdout.isatty()
    if not plain:
        try:
            return RichDisplay()
        except ImportError:
            pass
    return PlainDisplay()
