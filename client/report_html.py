"""The run report as one HTML page: inline CSS, PNG curves as data: URIs, a few lines of inline script.

The page loads nothing — its Content-Security-Policy forbids any fetch — so it opens the same offline, archived
or mailed. Everything a model or an env wrote (observations, actions, infos, errors) is HTML-escaped: a policy
that learns to print `<script>` shows it as text.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
from typing import TYPE_CHECKING

from rollart.client.exporters import flatten
from rollart.contracts.training import played_success
from rollart.infra.temporal.history import busy_seconds

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from rollart.client.report import Ledger, ReportData, Sample, TaskSamples
    from rollart.client.trajectory_view import TrajectoryView, TurnView

__all__ = ["render_report"]

MAX_CHARS = 4000  # longest observation or action shown whole; a chat prompt grows every turn
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1280px;padding:0 16px
48px;color:#1d1d1f}
h1{font-size:22px;margin:20px 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px} nav a{margin-right:14px} .muted{color:#666} img{max-width:100%}
table{border-collapse:collapse;margin:6px 0} td,th{border:1px solid #ddd;padding:3px
8px;text-align:left;vertical-align:top}
th{background:#f4f4f6} td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font:12px/1.35 ui-monospace,Menlo,Consolas,monospace}
details{margin:4px 0} summary{cursor:pointer} details.traj{border:1px solid #e3e3e8;border-radius:6px;padding:4px 8px}
details.traj[open]{background:#fbfbfd} .note{background:#fff4e5;border:1px solid #f0c36d;padding:6px
10px;border-radius:6px}
.ok{color:#137333} .bad{color:#b3261e} .tag{font-size:12px;padding:0 6px;border-radius:8px;background:#eee}
table.turns{width:100%} table.turns td:nth-child(2),table.turns td:nth-child(3){min-width:280px}
table.turns td:nth-child(7){white-space:nowrap} button{margin-right:6px}
"""

_JS = """
function setAll(open){document.querySelectorAll('details').forEach(function(d){d.open=open;});}
"""


def render_report(data: ReportData) -> str:
    """The whole page for `data`."""
    parts = [
        _header(data),
        _ledger_section(data.ledger),
        _curves_section(data),
        _engines_section(data.metrics),
        _placement_section(data.metrics),
        _timeline_section(data.timeline),
        _trajectories_section(data),
    ]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        "<title>rollart report: "
        f"{_e(data.job_id)}</title><style>{_CSS.strip()}</style><script>{_JS.strip()}</script></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


def _e(value: object) -> str:
    """Any text as HTML: escaped, quotes included (safe inside attributes too)."""
    return html.escape(str(value), quote=True)


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… (+{len(text) - limit} chars)"


def _pre(text: str) -> str:
    return f"<pre>{_e(_cut(text))}</pre>"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _png(fig: Figure, alt: str) -> str:
    """A figure as an <img> whose PNG is in the page itself (a data: URI)."""
    from rollart.client.plot import png_bytes

    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png_bytes(fig)).decode()}">'


# ------------------------------------------------------------------ sections


def _header(data: ReportData) -> str:
    created = datetime.datetime.fromtimestamp(data.created).strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"run dir <code>{_e(data.run_dir)}</code> · written {created}"]
    if data.metrics:
        last = data.metrics[-1]
        lines.append(
            f"{len(data.metrics)} steps recorded (last: step {last.get('step')}, policy v{last.get('version')}) · "
            f"{last.get('elapsed_s', 0) / 60:.1f} min · last reward {_num(last.get('reward_mean'))} · "
            f"success {_num(played_success(last), '.2f')}"
        )
    if data.ui:
        from rollart.infra.temporal.connection import ui_url

        lines.append(f"Temporal UI: <code>{_e(ui_url(data.ui, data.namespace, data.job_id))}</code>")
    nav = "".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in (
            ("ledger", "ledger"),
            ("curves", "learning curves"),
            ("timeline", "pool timeline"),
            ("trajectories", "trajectories"),
        )
    )
    return (
        f"<h1>rollart run report: {_e(data.job_id)}</h1>"
        + "".join(f'<div class="muted">{x}</div>' for x in lines)
        + f"<nav>{nav}</nav>"
    )


def _ledger_section(ledger: Ledger | None) -> str:
    if ledger is None:
        return '<h2 id="ledger">Ledger</h2><p class="muted">no step recorded yet</p>'
    terms = [
        ("trained", ledger.trained),
        ("dropped (too stale)", ledger.dropped),
        ("filtered (no reward variance)", ledger.filtered),
        ("failed", ledger.failed),
        ("in flight, cancelled at the end" if ledger.final else "in flight", ledger.in_flight),
        ("buffered, never trained on" if ledger.final else "buffered", ledger.buffered),
    ]
    rows = "".join(f'<tr><td>{name}</td><td class="n">{n}</td></tr>' for name, n in terms)
    check = (
        '<span class="ok">balanced</span>'
        if ledger.balanced
        else f'<span class="bad">off by {ledger.started - ledger.accounted}</span>'
    )
    return (
        f'<h2 id="ledger">Ledger</h2><p>started = trained + dropped + filtered + failed + in flight + buffered: '
        f'{check} <span class="muted">(from {_e(ledger.source)})</span></p>'
        f'<table><tr><th>started</th><th class="n">{ledger.started}</th></tr>{rows}</table>'
    )


def _curves_section(data: ReportData) -> str:
    from rollart.client.plot import learning_figure, train_figure

    head = '<h2 id="curves">Learning curves</h2>'
    if not data.metrics:
        return head + '<p class="muted">no step recorded yet: metrics.jsonl is missing or empty</p>'
    out = [head, _png(learning_figure(data.metrics, data.job_id), "reward and success vs step and wall time")]
    if (fig := train_figure(data.metrics)) is not None:
        out += ["<h3>Trainer</h3>", _png(fig, "trainer metrics vs step")]
    last = flatten(data.metrics[-1])
    cells = "".join(f'<tr><td>{_e(k)}</td><td class="n">{v:.6g}</td></tr>' for k, v in sorted(last.items()))
    out.append(f"<details><summary>every scalar of the last step record</summary><table>{cells}</table></details>")
    return "".join(out)


ENGINE_FIELDS = ("admission_cap", "kv_usage", "preempted", "prefix_hit_rate")
ENGINE_ROWS = 12  # the engines' last steps shown (metrics.jsonl has them all)


def _engines_section(metrics: list[dict]) -> str:
    """The admission cap and the engines' pressure at each of the last steps; nothing when no engine reported."""
    rows = [r for r in metrics if any(r.get(k) is not None for k in ENGINE_FIELDS)]
    if not rows:
        return ""
    head = (
        '<h2 id="engines">Engines and admission</h2><p class="muted">As the engines last reported when each step '
        "was trained: the fullest KV cache, preemptions and prefix-cache hits since they started (summed over "
        "engines), and the cap on trajectories in flight that engine pressure allowed (training.admission).</p>"
    )
    cells = "".join(
        f'<tr><td class="n">{r.get("step")}</td><td class="n">{_count(r.get("admission_cap"))}</td>'
        f'<td class="n">{_share(r.get("kv_usage"))}</td><td class="n">{_count(r.get("preempted"))}</td>'
        f'<td class="n">{_share(r.get("prefix_hit_rate"))}</td></tr>'
        for r in rows[-ENGINE_ROWS:]
    )
    return (
        f"{head}<table><tr><th>step</th><th>admission cap</th><th>KV (fullest)</th><th>preempted</th>"
        f"<th>prefix-cache hits</th></tr>{cells}</table>"
    )


def _placement_section(metrics: list[dict]) -> str:
    """Each plan `generate_pool: auto` made (the step after which it was made, where tasks went, and why)."""
    rows = [r for r in metrics if r.get("placement_plan")]
    if not rows:
        return ""
    head = (
        '<h2 id="placement">Placement</h2><p class="muted">Where the tasks with generate_pool: auto generated: each '
        "plan, made from the steps' measured tokens and the engines' measured rates (training.placement).</p>"
    )
    cells = "".join(
        f'<tr><td class="n">{r.get("step")}</td><td>{_e(r["placement_plan"][0])}</td>'
        f"<td>{'<br>'.join(_e(x) for x in r['placement_plan'][1:])}</td></tr>"
        for r in rows[-ENGINE_ROWS:]
    )
    return f"{head}<table><tr><th>after step</th><th>placement</th><th>why</th></tr>{cells}</table>"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _timeline_section(timeline: list[dict]) -> str:
    from rollart.client.plot import timeline_figure, timeline_pools

    head = '<h2 id="timeline">Pool timeline</h2>'
    if not timeline:
        return head + '<p class="muted">no timeline.jsonl in the run dir (written when `rollart train` ends)</p>'
    t0, t1 = min(r["start"] for r in timeline), max(r["end"] for r in timeline)
    rows = []
    for pool, role in timeline_pools(timeline):
        spans = [(r["start"], r["end"]) for r in timeline if r["pool"] == pool]
        busy = busy_seconds(spans)
        rows.append(
            f'<tr><td>{_e(pool)}</td><td>{_e(role or "")}</td><td class="n">{len(spans)}</td>'
            f'<td class="n">{busy:.1f}</td>'
            f'<td class="n">{busy / max(t1 - t0, 1e-9):.0%}</td></tr>'
        )
    table = (
        "<table><tr><th>pool</th><th>role</th><th>activities</th><th>busy s</th><th>busy share</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    return head + _png(timeline_figure(timeline), "each pool's busy time") + table


def _trajectories_section(data: ReportData) -> str:
    out = ['<h2 id="trajectories">Trajectories</h2>']
    if data.note:
        out.append(f'<p class="note">{_e(data.note)}</p>')
    if data.samples:
        out.append(
            '<p><button onclick="setAll(true)">expand all</button><button onclick="setAll(false)">collapse all'
            "</button></p>"
        )
    out += [_task_section(t) for t in data.samples]
    return "".join(out)


def _task_section(t: TaskSamples) -> str:
    groups = [("best rewards", t.best), ("worst rewards", t.worst), ("failed", t.failed)]
    body = "".join(
        f"<details open><summary><b>{name}</b> "
        f"({len(s)})</summary>{''.join(_sample(x) for x in s) or '<p class=muted>none</p>'}"
        "</details>"
        for name, s in groups
    )
    counts = ", ".join(f"{n} {_e(status)}" for status, n in t.statuses.items())
    read = f"{t.scanned} trajectories read" + (f": {counts}" if counts else "")
    return f'<h3>task {_e(t.task)} <span class="muted">({read})</span></h3>{body}'


def _sample(s: Sample) -> str:
    r = s.row
    ok = r.status == "completed"
    summary = (
        f'<span class="{"ok" if ok else "bad"}">{_e(r.status)}</span> <code>{_e(r.trajectory_id)}</code> · '
        f"reward {_num(r.reward)} · success {'-' if r.success is None else 'yes' if r.success else 'no'} · "
        f"{'-' if r.turns is None else r.turns} turn(s) · {_e(r.versions)}"
    )
    body = _view(s.view) if s.view else ""
    if r.error:
        body = f'<p class="bad">error: {_e(r.error)}</p>' + body
    if s.note:
        body += f'<p class="note">{_e(s.note)}</p>'
    return f'<details class="traj"><summary>{summary}</summary>{body}</details>'


def _view(v: TrajectoryView) -> str:
    """A trajectory as `rollart show` prints it: its header, then a table with a row per turn."""
    r = v.result
    meta = [f"workflow {_e(v.workflow_type)} <code>{_e(v.workflow_id)}</code> ({_e(v.workflow_status)})"]
    if r:
        meta.append(
            f"task {_e(r.task)} · seed {r.seed} · tokens {r.prompt_tokens} prompt + {r.completion_tokens} "
            f"completion · policy versions {_e(v.versions)} · env worker {_e(r.env_worker or '-')}"
        )
    if v.error and not (r and r.error == v.error):
        meta.append(f'<span class="bad">error: {_e(v.error)}</span>')
    head = (
        "<tr><th>#</th><th>observation</th><th>action</th><th>env reward</th>"
        "<th>done</th><th>info</th><th>tokens</th></tr>"
    )
    rows = "".join(_turn(t) for t in v.turns)
    final = f"<p><b>final observation</b></p>{_pre(v.final_observation)}" if v.final_observation else ""
    table = f'<table class="turns">{head}{rows}</table>' if v.turns else '<p class="muted">no turn recorded</p>'
    return "".join(f'<div class="muted">{m}</div>' for m in meta) + table + final


def _turn(t: TurnView) -> str:
    done = "-" if t.done is None else "yes" if t.done else "no"
    info = json.dumps(t.info, default=str, sort_keys=True) if t.info else "{}"
    tokens = [
        f"{_count(t.prompt_tokens)} + {_count(t.completion_tokens)}"
        + (f" ({t.finish_reason})" if t.finish_reason else "")
    ]
    if t.logprobs:
        tokens.append(f"logprob mean {t.logprobs.mean:.3f}")
    if t.policy_version is not None:
        tokens.append(
            f"v{t.policy_version}" + ("" if t.policy_version_end == t.policy_version else f"→v{t.policy_version_end}")
        )
    reward = "-" if t.env_reward is None else format(t.env_reward, "g")
    return (
        f'<tr class="turn"><td class="n">{t.index}</td><td>{_pre(t.observation)}</td><td>{_pre(t.action)}</td>'
        "<td "
        f'class="n">{reward}</td><td>{done}</td><td>{_pre(info)}</td><td>{"<br>".join(_e(x) for x in tokens)}</td></tr>'
    )


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)
