"""Which processes ask for the parent-death signal (no process started: the decision, not the signal)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollart.workers import lifeline


@pytest.mark.parametrize(
    "worker_env, parent_pid, asks",
    [
        ("100", 100, True),  # the EngineCore: a multiprocessing child of the rollart worker
        ("100", 200, False),  # a grandchild (vLLM's tensor-parallel process): vLLM's death pipe ends it
        (None, 100, False),  # vLLM outside a rollart worker (eval, tests)
        ("100", None, False),  # the worker itself (no multiprocessing parent)
    ],
)
def test_only_a_workers_own_engine_child_asks_to_die_with_it(
    monkeypatch: pytest.MonkeyPatch, worker_env: str | None, parent_pid: int | None, asks: bool
) -> None:
    asked: list[int | None] = []
    monkeypatch.setattr(lifeline, "die_with_parent", lambda parent=None: asked.append(parent))
    parent = None if parent_pid is None else SimpleNamespace(pid=parent_pid)
    monkeypatch.setattr(lifeline.multiprocessing, "parent_process", lambda: parent)
    if worker_env is None:
        monkeypatch.delenv(lifeline.DIE_WITH_PARENT_ENV, raising=False)
    else:
        monkeypatch.setenv(lifeline.DIE_WITH_PARENT_ENV, worker_env)
    lifeline.vllm_plugin()
    assert asked == ([parent_pid] if asks else [])


def test_engine_children_are_marked_with_pool_pid_and_model_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(lifeline.ENGINE_MARK_ENV, raising=False)
    lifeline.mark_engine_children("h800", tmp_path / "m")
    assert os.environ[lifeline.ENGINE_MARK_ENV] == f"h800|{os.getpid()}|{(tmp_path / 'm').resolve()}"


def test_the_vllm_plugin_is_installed_and_its_absence_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert lifeline.plugin_problem() is None  # pyproject's entry point, installed by `make setup`
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    assert "VLLM_PLUGINS='lora_filesystem_resolver' leaves out the plugin 'rollart_die_with_parent'" in str(
        lifeline.plugin_problem()
    )
