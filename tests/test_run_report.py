"""The run report (`runs/<id>/report.html`): rendered from hand-built data, opened in headless Chromium, and built
from a real training run on the session stack with `rollart report`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html import escape
from pathlib import Path

import pytest

from rollart.client.job_trajectories import TrajectoryRow
from rollart.client.report import Ledger, ReportData, Sample, TaskSamples, gather_report, ledger_of, write_report
from rollart.client.trajectory_view import CallInfo, TrajectoryView, TurnView, summarize_logprobs
from rollart.contracts.rollouts import TrajectoryResult
from rollart.spec.config import JobSpec
from tests.support.paths import REPO
from tests.support.tasks import frozenlake_task

EVIL = (
    "<script>document.title='pwned'</script><img src=\"http://example.com/pwn.png\" onerror=\"document.title='pwned'\">"
)
"""What a policy might print: executed or fetched, it would change the title or reach the network."""

# An attribute that makes a browser fetch: src=, href=, srcset=, poster=, data=, action= to a URL with a host
# (http:, https:, ws:, protocol-relative //), or a CSS url()/@import of one.
_FETCH = re.compile(
    r"""(?:\b(?:src|href|srcset|poster|data|action)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//)|"""
    r"""(?:url\(\s*["']?\s*(?:https?:)?//)|(?:@import)""",
    re.IGNORECASE,
)


# ------------------------------------------------------------------ hand-built run dir and trajectories


def _metrics(steps: int = 6) -> list[dict]:
    rows = []
    for s in range(steps):
        trained = 8 * (s + 1)
        rows.append(
            {
                "step": s,
                "version": s + 1,
                "time": 1000.0 + s,
                "samples": 8,
                "reward_mean": 0.1 * s,
                "success_rate": 0.1 * s,
                "task_success": {"frozenlake": 0.1 * s},
                "staleness_mean": 0.5,
                "staleness_max": 1,
                "completion_tokens": 64,
                "started": trained + 16,
                "trained": trained,
                "dropped": 4,
                "filtered": 4,
                "failed": 2,
                "in_flight": 4,
                "buffered": 2,
                "train": {
                    "loss": 0.5 - 0.05 * s,
                    "entropy": 3.0 - 0.3 * s,
                    "kl": 0.01 * s,
                    "grad_norm": 1.0,
                    "lr": 1e-4,
                },
                "elapsed_s": 10.0 * (s + 1),
                "step_interval_s": 10.0,
                "trajectories_per_s": 1.0,
                "tokens_per_s": 6.4,
            }
        )
    return rows


def _timeline() -> list[dict]:
    return [
        {"workflow": f"w{i}", "pool": pool, "activity": act, "start": 1000.0 + i, "end": 1000.5 + i}
        for i, (pool, act) in enumerate(
            [
                ("cpu", "reset"),
                ("h800", "generate"),
                ("cpu", "step"),
                ("serverless", "reward"),
                ("trainer", "train_step"),
            ]
        )
    ]


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "job-20261201-000000-ab12"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _metrics()))
    (run_dir / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _timeline()))
    return run_dir


def _turn(i: int, observation: str, action: str, reward: float = 0.0) -> TurnView:
    return TurnView(
        index=i,
        observation=observation,
        action=action,
        data_key=f"trajectories/j/t/turn-{i:03d}",
        env_reward=reward,
        done=reward > 0,
        info={"position": [0, i]},
        prompt_tokens=40,
        completion_tokens=2,
        finish_reason="length",
        policy_version=3,
        policy_version_end=3,
        logprobs=summarize_logprobs([-0.5, -1.5]),
        generate=CallInfo("generate", "h800-ab12", "h800", 0.01, 0.2, True),
        step=CallInfo("step", "cpu-cd34", "cpu@cpu-cd34", 0.002, 0.004, True),
    )


def _sample(tid: str, reward: float, turns: list[TurnView], status: str = "completed") -> Sample:
    error = None if status == "completed" else "env raised: boom <b>"
    result = TrajectoryResult(
        trajectory_id=tid,
        task="frozenlake",
        seed=7,
        status=status,
        reward=reward,  # type: ignore[arg-type]
        success=reward >= 1,
        turns=len(turns),
        policy_version_min=3,
        policy_version_max=3,
        prompt_tokens=80,
        completion_tokens=4,
        env_worker="cpu-cd34",
        error=error,
    )
    view = TrajectoryView(
        trajectory_id=tid,
        workflow_id=tid,
        run_id="run",
        workflow_type="TrajectoryWorkflow",
        workflow_status="completed",
        result=result,
        turns=turns,
        final_observation="SFFF\nFHFH\nG",
    )
    row = TrajectoryRow(
        trajectory_id=tid,
        workflow_id=tid,
        task="frozenlake",
        status=status,
        reward=reward,
        success=reward >= 1,
        turns=len(turns),
        versions="v3..v3",
        error=error,
    )
    return Sample(row, view)


def _samples() -> list[TaskSamples]:
    best = _sample(
        "job-frozenlake-0001", 1.0, [_turn(0, "SFFF\nFHFH\nmove:", "right"), _turn(1, "obs one", "down", 1.0)]
    )
    worst = _sample("job-frozenlake-0002", 0.0, [_turn(0, "the board " + EVIL, "answer " + EVIL)])
    failed = _sample("job-frozenlake-0003", 0.0, [_turn(0, "obs before the crash", "left")], status="failed")
    gone = Sample(
        TrajectoryRow("job-g000004", "job-g000004", "frozenlake", "failed", error="workflow failed"),
        note="no turns recorded for job-g000004",
    )
    return [
        TaskSamples(
            task="frozenlake",
            scanned=12,
            statuses={"cancelled": 2, "completed": 8, "failed": 2},
            best=[best],
            worst=[worst],
            failed=[failed, gone],
        )
    ]


def _job() -> JobSpec:
    return JobSpec(name="j", tasks=[frozenlake_task()])


def _report(tmp_path: Path) -> Path:
    run_dir = _run_dir(tmp_path)
    from rollart.client.plot import read_jsonl

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    data = ReportData(
        job_id=run_dir.name,
        run_dir=run_dir,
        metrics=metrics,
        timeline=_timeline(),
        ledger=ledger_of(metrics),
        samples=_samples(),
        ui="http://ui:8233",
    )
    return write_report(data)


# ------------------------------------------------------------------ unit: the page


def test_the_page_shows_curves_ledger_timeline_and_transcripts_and_loads_nothing(tmp_path: Path) -> None:
    path = _report(tmp_path)
    assert path == tmp_path / "job-20261201-000000-ab12" / "report.html"
    page = path.read_text()
    assert not _FETCH.search(page), _FETCH.search(page)
    assert page.count("<script") == 1 and "<script>function setAll" in page  # the page's own, inline
    assert "default-src 'none'" in page  # its CSP: a browser refuses any fetch even if one slipped in
    assert page.count('src="data:image/png;base64,') == 3  # learning curves, trainer metrics, timeline
    # the ledger, from the last step record: 64 started = 48 + 4 + 4 + 2 + 4 + 2
    assert '<th class="n">64</th>' in page and "balanced" in page and "step 5" in page
    for pool in ("cpu", "h800", "serverless", "trainer"):
        assert f"<td>{pool}</td>" in page
    # transcripts, turn by turn, every model text escaped
    assert page.count('<tr class="turn">') == 4
    assert "SFFF\nFHFH\nmove:" in page and "<pre>right</pre>" in page and "obs before the crash" in page
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page
    assert "<script>document.title" not in page and '<img src="http://example.com' not in page
    assert "12 trajectories read: 2 cancelled, 8 completed, 2 failed" in page
    assert "error: env raised: boom &lt;b&gt;" in page and "no turns recorded for job-g000004" in page
    assert "http://ui:8233/namespaces/default/workflows/job-20261201-000000-ab12" in page  # printed, not linked


def test_ledger_comes_from_the_result_when_there_is_one() -> None:
    from rollart.contracts.training import TrainingResult

    result = TrainingResult(
        job_id="j",
        steps=6,
        version=6,
        started=70,
        trained=48,
        dropped=4,
        failed=2,
        cancelled_in_flight=10,
        buffered_unused=2,
        filtered=4,
    )
    ledger = ledger_of(_metrics(), result)
    assert ledger is not None and ledger.balanced and (ledger.started, ledger.in_flight) == (70, 10)
    assert "result" in ledger.source and ledger.final
    assert ledger_of([]) is None
    off = Ledger(started=10, trained=5, dropped=0, filtered=0, failed=0, in_flight=0, buffered=0, source="x")
    assert not off.balanced


async def test_an_unreachable_server_leaves_out_only_the_trajectories(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)

    async def unreachable():  # type: ignore[no-untyped-def]
        raise ConnectionError("cannot reach the Temporal server at 127.0.0.1:1")

    data = await gather_report(run_dir, run_dir.name, unreachable)
    assert data.note == "trajectories could not be loaded: cannot reach the Temporal server at 127.0.0.1:1"
    assert len(data.metrics) == 6 and len(data.timeline) == 5 and data.samples == []
    page = write_report(data).read_text()
    assert "cannot reach the Temporal server" in page and page.count("data:image/png;base64,") == 3


async def test_a_report_that_fails_never_fails_the_training_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import rollart.cli.report
    from rollart.cli.train import write_run_report

    async def broken(*args: object, **kw: object) -> None:
        raise ValueError("a bad row")

    monkeypatch.setattr(rollart.cli.report, "build_report", broken)
    assert await write_run_report(None, _job(), "j", _run_dir(tmp_path), "", note="x") is None
    assert "report: not written (ValueError: a bad row)" in capsys.readouterr().out


async def test_the_training_command_writes_the_report_without_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollart.cli.train import write_run_report

    run_dir = _run_dir(tmp_path)
    path = await write_run_report(
        None, _job(), run_dir.name, run_dir, "", note="trajectories not loaded: the client failed (RuntimeError: x)"
    )
    assert path == run_dir / "report.html" and "the client failed" in path.read_text()
    assert f"report: {path}" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert await write_run_report(None, _job(), "e", empty, "", note="x") is None  # nothing to show
    assert not (empty / "report.html").exists()


# ------------------------------------------------------------------ a browser: headless Chromium


def _chromium() -> str | None:
    return next((p for name in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(name))), None)


def _browse(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Chromium on `page` with no way to resolve a host (a fetch fails rather than leaves the machine) and none
    of its own background traffic, so that its net log holds only what the page asked for."""
    browser = _chromium()
    assert browser is not None
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        *extra,
        page.as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _page_fetches(net_log: Path) -> list[str]:
    """The network URLs the page itself requested, from Chromium's net log (the browser's own requests, such as
    update checks, have no origin as initiator)."""
    text = net_log.read_text()
    try:
        log = json.loads(text)
    except json.JSONDecodeError:  # a log cut short at exit: close it
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    return [
        p["url"]
        for e in log["events"]
        if names.get(e["type"]) == "URL_REQUEST_START_JOB"
        and (p := e.get("params", {})).get("url", "").startswith(("http:", "https:", "ws:", "wss:"))
        and p.get("initiator") != "not an origin"
    ]


@pytest.mark.integration
@pytest.mark.skipif(_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_chromium_renders_the_report_offline(tmp_path: Path) -> None:
    from PIL import Image

    page = _report(tmp_path)
    shot = tmp_path / "report.png"
    done = _browse(page, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,2000")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    with Image.open(shot) as img:
        assert img.size == (1280, 2000)
        colors = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colors is None or len(colors) > 50, "the screenshot is (nearly) blank"

    net_log = tmp_path / "net.json"
    dom = _browse(page, tmp_path / "profile-dom", "--dump-dom", f"--log-net-log={net_log}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "<title>rollart report: job-20261201-000000-ab12</title>" in html  # no model text ran to change it
    assert html.count('<tr class="turn">') == 4 and "obs before the crash" in html
    assert re.search(r'<img alt="reward and success[^"]*" src="data:image/png;base64,', html)
    assert "&lt;script&gt;document.title=" in html and '<img src="http://example.com' not in html  # text, no element
    assert _page_fetches(net_log) == []

    # the check above can fail: the same browser, on a page that does fetch, logs it
    control = tmp_path / "control.html"
    control.write_text('<html><body><img src="http://example.com/x.png"><p>control</p></body></html>')
    control_log = tmp_path / "control-net.json"
    assert _browse(control, tmp_path / "profile-control", "--dump-dom", f"--log-net-log={control_log}").returncode == 0
    assert _page_fetches(control_log) == ["http://example.com/x.png"]


# ------------------------------------------------------------------ integration: a real run on the session stack


def _rollart(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollart.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


@pytest.mark.integration
async def test_rollart_report_on_a_real_training_run(stack, stack_job, client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from rollart.cli.train import write_run_report
    from rollart.infra.store.payload import LocalStore
    from tests.support.training_runs import run_job

    job, result, _, rows = await run_job(client, stack_job, tmp_path, steps=2, batch_size=8)
    job_id = job.name
    run_dir = tmp_path / job_id
    assert len(rows) == 2

    # what `rollart train` does at the end, with its client and the job's result
    path = await write_run_report(client, stack_job, job_id, run_dir, "", result=result)
    assert path == run_dir / "report.html"
    data = await gather_report(run_dir, job_id, client, LocalStore(stack_job.store.path), result=result, per_task=2)
    assert data.note is None and [t.task for t in data.samples] == ["frozenlake"]
    picked = data.samples[0].best + data.samples[0].worst
    assert len(picked) == 4 and all(s.view is not None and s.view.turns for s in picked)
    assert data.ledger is not None and data.ledger.balanced and data.ledger.started == result.started
    assert all(s.row.status == "failed" for s in data.samples[0].failed)  # not those the job's end cancelled

    # the command, on the same run dir
    out = tmp_path / "elsewhere.html"
    done = _rollart(
        "report",
        str(run_dir),
        "--out",
        str(out),
        "--samples",
        "2",
        "--temporal-address",
        stack.address,
        "--store-path",
        str(stack_job.store.path),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shown = len(picked) + len(data.samples[0].failed)  # failed: none, unless an episode failed on this stack
    assert f"wrote {out}: 2 steps, {shown} trajectories of 1 task(s)" in done.stdout
    page = out.read_text()
    assert not _FETCH.search(page)
    assert page.count('<tr class="turn">') == sum(len(s.view.turns) for s in picked if s.view)
    first = picked[0].view.turns[0]  # type: ignore[union-attr]
    assert f"<pre>{escape(first.observation)}</pre>" in page and f"<pre>{escape(first.action)}</pre>" in page
    assert "trajectories could not be loaded" not in page

    # the server gone (a port nobody serves): the page still comes, with its curves and a note
    from rollart.infra.local.devserver import free_port

    down = _rollart(
        "report",
        str(run_dir),
        "--out",
        str(tmp_path / "down.html"),
        "--temporal-address",
        f"127.0.0.1:{free_port()}",
        "--timeout",
        "30",
    )
    assert down.returncode == 0, down.stdout + down.stderr
    page = (tmp_path / "down.html").read_text()
    assert "trajectories could not be loaded: cannot reach the Temporal server" in page
    assert page.count("data:image/png;base64,") >= 2
