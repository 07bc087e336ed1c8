"""`rollart train examples/agent_program.yaml`: an agent program written against the `openai` client, trained for 3
steps through the endpoint on the local stack the command starts (the HF engine, for speed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollart.contracts.store import StoredTurn
from rollart.infra.local.devserver import free_port
from rollart.infra.tiny_model import build_tiny_model
from rollart.spec.config import EngineConfig, load_job
from tests.support.cli import rollart
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

LEDGER = re.compile(
    r"done: (\d+) steps, policy v(\d+); trajectories started (\d+) = trained (\d+) \+ dropped (\d+) \+ "
    r"(?:filtered (\d+) \+ )?failed (\d+) \+ cancelled in flight (\d+) \+ buffered (\d+)"
)


@pytest.mark.timeout(600)
def test_the_agent_program_example_trains_three_steps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = load_job(REPO / "examples" / "agent_program.yaml")
    job = base.model_copy(
        update={
            "model_dir": build_tiny_model(tmp_path / "tiny-chat", chat=True),
            "store": base.store.model_copy(update={"path": tmp_path / "store"}),
            "engine": EngineConfig(kind="hf"),
        }
    )
    spec = tmp_path / "job.json"
    spec.write_text(job.model_dump_json())
    monkeypatch.chdir(REPO)  # the workers import examples.agent_program from their working directory, as users do
    args = ["--steps", "3", "--home", str(tmp_path / "home"), "--run-dir", str(tmp_path / "run")]
    done = rollart(capsys, "train", str(spec), *args, "--port", str(free_port()), "--ui-port", str(free_port()))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    m = LEDGER.search(done.stdout)
    assert m, done.stdout[-3000:]
    steps, version, started, trained, dropped, filtered, failed, cancelled, buffered = (int(g or 0) for g in m.groups())
    assert steps == 3 and version == 3 and trained >= 24, done.stdout[-2000:]
    assert started == trained + dropped + filtered + failed + cancelled + buffered
    assert failed == 0, done.stdout[-3000:]
    # an answer without the tool is asked again: the second request continued the first token by token
    seconds = [StoredTurn.from_bytes(p.read_bytes()) for p in (tmp_path / "store").glob("trajectories/*/*/turn-001")]
    assert seconds and all(t.format == 2 and (t.prefix_key or "").endswith("/turn-000") for t in seconds)
