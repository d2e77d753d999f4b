"""report.html: one self-contained page (plots embedded) with everything a qualification
found: the verdict, the table per occurrence, recoveries, fault-free runs, families left
out and why, and where each artifact is."""

from __future__ import annotations

import base64
import html
import os
from typing import Any

from lm_resiliency.qualify.rows import exclusion_lines, rows

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}.yes{color:#0a7d20}.no{color:#b00020;font-weight:bold}.pass{color:#0a7d20}
.fail{color:#b00020}img{max-width:100%;border:1px solid #ddd;margin:.5em 0}code{background:#f6f6f6;padding:1px 4px}"""


def _e(v: Any) -> str:
    return html.escape(str(v))


def _yes(v: Any) -> str:
    if v is None:
        return "-"
    return f'<span class="{"yes" if v else "no"}">{"yes" if v else "no"}</span>'


def _image(path: str) -> str:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<img alt="{_e(os.path.basename(path))}" src="data:image/png;base64,{data}">'


def _run_section(run: Any, titles: dict[str, str], out: str) -> str:
    o = run.outcome
    parts = [f"<h2>{_e(run.label)}: {_e(o.campaign.name)} "
             f'<span class="{"pass" if run.passed else "fail"}">{"passed" if run.passed else "failed"}</span></h2>',
             f"<p>{len(o.generations)} generation(s), {run.seconds:.0f} s; manifest <code>{_e(o.campaign.identity)}</code></p>"]
    if o.report.occurrences:
        parts.append("<table><tr><th>occurrence</th><th>family</th><th>expected</th><th>injected</th><th>detected</th>"
                     "<th>localized</th><th>latency</th><th>rollback</th><th>recovery</th><th>action</th>"
                     "<th>reasons</th></tr>")
        for r in rows(run.outcome, titles):
            latency = "-" if r["latency_ms"] is None else f"{r['latency_ms']:.0f} ms"
            rollback = "-" if r["rollback_steps"] is None else f"{r['rollback_steps']} steps"
            recovery = "-" if r["recovery_s"] is None else f"{r['recovery_s']:.1f} s"
            parts.append(f"<tr><td>{_e(r['occurrence'])}</td><td>{_e(r['family'])}</td><td>{_e(r['expected'])}</td>"
                         f"<td>{_yes(r['injected'])}</td><td>{_yes(r['detected'])}</td><td>{_yes(r['localized'])}</td>"
                         f"<td>{latency}</td><td>{rollback}</td><td>{recovery}</td><td>{_e(r['action'] or '-')}</td>"
                         f"<td>{_e('; '.join(r['reasons']))}</td></tr>")
        parts.append("</table>")
    residual = sum(1 for a in o.attributions if a.explanation == "residual")
    parts.append(f"<p>{len(o.attributions)} attributions: {len(o.attributions) - residual - len(o.unexplained)} "
                 f"explained by an occurrence, {residual} residual (lasting divergence of a state fault that ended), "
                 f"{len(o.unexplained)} unexplained.</p>")
    if o.recoveries:
        parts.append("<table><tr><th>decided at</th><th>action</th><th>resumed from</th><th>rollback</th>"
                     "<th>recovery time</th><th>load</th></tr>")
        for r in o.recoveries:
            parts.append(f"<tr><td>step {r.decided_at}</td><td>{_e(r.describe())}</td>"
                         f"<td>{_e(r.checkpoint)} (step {r.resumed_step})</td><td>{r.rollback_steps} steps</td>"
                         f"<td>{_e(r.recovery_seconds)} s</td><td>{_e(r.load_seconds)} s</td></tr>")
        parts.append("</table>")
    excluded = exclusion_lines(o)
    if excluded:
        parts.append("<h3>Nodes excluded</h3><ul>" + "".join(
            f"<li class='{'fail' if 'FALSE' in x or x.startswith('NOT') else 'pass'}'>{_e(x)}</li>" for x in excluded)
            + "</ul>")
    failures = run.failures()
    if failures:
        parts.append("<ul>" + "".join(f"<li class='fail'>{_e(f)}</li>" for f in failures) + "</ul>")
    rel = os.path.relpath(run.run_dir, out)
    artifacts = ["plan.json", "localization.json", "compare.txt", "compare.json", "report.json", "replay-results.jsonl",
                 "fault-reports.json", "recovery-decisions.json", "run-summary.json", "checkpoints/lmr-trust-manifest.json",
                 "checkpoints/lmr-exclusions.json", "gen-*/injections-rank-*.json", "torchrun*.log"]
    parts.append("<p>Artifacts: " + ", ".join(f"<code>{_e(os.path.join(rel, a))}</code>" for a in artifacts) + "</p>")
    return "\n".join(parts)


def write_html(path: str, summary: dict, runs: list[Any], titles: dict[str, str]) -> None:
    out = os.path.dirname(path)
    verdict = "passed" if summary["passed"] else "failed"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>lmr-qualify: {verdict}</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>lmr-qualify <span class='{'pass' if summary['passed'] else 'fail'}'>{verdict}</span></h1>",
             f"<p>{summary['world']} ranks, {_e(summary['parallel'])}, {_e(summary['device'])} "
             f"({_e(summary['backend'])}), {summary['steps']} steps per run.</p>"]
    if summary.get("left_out"):
        parts.append("<h3>Families left out for this configuration</h3><ul>"
                     + "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in summary["left_out"].items()) + "</ul>")
    if "repeat" in summary:
        rep = summary["repeat"]
        parts.append(f"<p>Over {rep['runs']} runs: {rep['localized']}/{rep['occurrences']} occurrences localized "
                     f"(95% interval {rep['localized_rate_95ci']}); mean latency {rep['mean_latency_ms']} ms "
                     f"(95% interval {rep['mean_latency_ms_95ci']}).</p>")
    if "clean" in summary:
        c = summary["clean"]
        parts.append(f"<p>{c['runs']} fault-free run(s): {c['checks']} checks, {c['attributions']} attributions, "
                     f"{c['stall_reports_naming_nobody']} stall reports naming nobody.</p>")
    for run in runs:
        parts.append(_run_section(run, titles, out))
    for name, plot in summary.get("plots", {}).items():
        if os.path.exists(plot):
            parts.append(f"<h3>{_e(name.replace('_', ' '))}</h3>{_image(plot)}")
    parts.append("</body></html>")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    os.replace(tmp, path)
