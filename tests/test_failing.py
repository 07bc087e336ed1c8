"""A trajectory is trained, dropped, failed or cancelled, never lost; a job that keeps failing ends with its reason.

The pure parts: the run of failures (workflows/training/failing.py), a unit that ended without reporting
(`loop.on_lost`), a failure's cause as a message and type (`failure_of`), and the simulator honouring both.
"""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError, TimeoutError, TimeoutType

from rollart.contracts.errors import ErrorType, failure_of
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import InFlight, TrainingPlan, TrainingState
from rollart.simulator.cluster import PoolSpec
from rollart.simulator.models import TaskProfile, TrainerModel
from rollart.simulator.roofline import MODELS
from rollart.simulator.run import Setup, simulate
from rollart.spec.config import JobSpec, TrainingConfig
from rollart.workflows.training import failing, loop
from tests.support.tasks import frozenlake_task


def plan(limit: int | None = 3, batch_size: int = 2, async_bound: int = 0) -> TrainingPlan:
    """A job of FrozenLake groups of 2 whose admission window is batch_size × (async_bound + 1) (2 by default)."""
    task = frozenlake_task(group_size=2, max_turns=2)
    training = TrainingConfig(steps=3, batch_size=batch_size, async_bound=async_bound, fail_after_failures=limit)
    return TrainingPlan.of(JobSpec(name="f", tasks=[task], training=training))


def in_flight(*units: tuple[str, str, list[str]]) -> TrainingState:
    """A state with (workflow, group, trajectory ids) in flight, as launches leave it."""
    s = TrainingState()
    for wf, group, tids in units:
        for t in tids:
            s.in_flight[t] = InFlight(group=group, workflow=wf)
        s.unfinished[group] = s.unfinished.get(group, 0) + len(tids)
        s.started += len(tids)
    return s


def failed(tid: str, error_type: str | None, group: str = "g0") -> TrajectoryResult:
    return TrajectoryResult(
        trajectory_id=tid, task="t", seed=0, group_id=group, status="failed", error="boom", error_type=error_type
    )


def test_failures_of_one_kind_in_a_row_end_the_job_and_a_completion_resets_the_run() -> None:
    p, s = plan(limit=3), in_flight(("w", "g0", ["a", "b", "c", "d", "e"]))
    failing.observe(s, [failed("a", "EnvBroken"), failed("b", "EnvBroken")])
    assert s.failing is not None and s.failing.count == 2 and failing.verdict(p, s) is None
    done = TrajectoryResult(trajectory_id="c", task="t", seed=0, status="completed", reward=1.0, success=True)
    failing.observe(s, [done])
    assert s.failing is None
    failing.observe(s, [failed("d", "EnvBroken"), failed("e", None)])  # a retryable failure leaves the run as is
    assert s.failing is not None and s.failing.count == 1


def test_the_verdict_names_the_reason_and_a_null_limit_never_gives_up() -> None:
    s = in_flight(("w", "g0", ["a", "b", "c"]))
    failing.observe(s, [failed(t, "InvalidInput") for t in "abc"])
    why = failing.verdict(plan(limit=3), s)
    assert why is not None and "3 trajectories in a row failed with InvalidInput" in why and "boom" in why
    assert failing.verdict(plan(limit=None), s) is None
    other = in_flight(("w", "g0", ["a", "b", "c"]))
    failing.observe(other, [failed("a", "InvalidInput"), failed("b", "EnvBroken"), failed("c", "InvalidInput")])
    assert other.failing is not None and other.failing.count == 1  # another reason starts a new run


def test_it_takes_a_whole_admission_window_failing_at_least() -> None:
    """At scale failures come back in seconds and completions in minutes, so a job's first reports may all be
    failures: only a whole window of them (every trajectory that was in flight) says none can complete."""
    p = plan(limit=3, batch_size=4, async_bound=1)  # 8 may be in flight
    s = in_flight(("w", "g0", [f"t{i}" for i in range(8)]))
    failing.observe(s, [failed(f"t{i}", "EnvBroken") for i in range(7)])
    assert failing.threshold(p) == 8 and failing.verdict(p, s) is None
    failing.observe(s, [failed("t7", "EnvBroken")])
    assert failing.verdict(p, s) is not None


def test_a_repeated_report_does_not_extend_the_run() -> None:
    s = in_flight(("w", "g0", ["a"]))
    failing.observe(s, [failed("zz", "InvalidInput")])  # not in flight: a repeat
    assert s.failing is None


def test_a_unit_that_ended_without_reporting_counts_its_trajectories_as_failed() -> None:
    p = plan()
    s = in_flight(("w1", "g0", ["a", "b"]), ("w2", "g1", ["c", "d"]))
    book = loop.Ledger(p)
    assert loop.on_lost(p, s, book, "w1", "w1: terminated", None) == 2
    assert s.failed == 2 and set(s.in_flight) == {"c", "d"} and "g0" not in s.unfinished
    assert s.ledger_balanced and s.ready_groups == []  # a group whose members all failed is never trainable
    assert loop.on_lost(p, s, book, "w1", "again", None) == 0  # nothing of w1 is left in flight
    assert loop.on_lost(p, s, book, "w2", "InvalidInput: no chat template", "InvalidInput") == 2
    assert s.failing is not None and s.failing.count == 2 and s.ledger_balanced


def test_failure_of_gives_the_cause_and_a_type_only_when_no_retry_cures_it() -> None:
    def wrapped(cause: BaseException) -> Exception:
        err = Exception("child failed")
        err.__cause__ = cause
        return err

    bad = ApplicationError("no chat template", type=ErrorType.INVALID_INPUT.value, non_retryable=True)
    assert failure_of(wrapped(bad)) == ("InvalidInput: no chat template", "InvalidInput")
    flaky = ApplicationError("flaky", type="Flaky")
    assert failure_of(wrapped(flaky)) == ("Flaky: flaky", None)
    assert failure_of(wrapped(TerminatedError("by an operator", []))) == ("terminated: by an operator", None)
    assert failure_of(wrapped(TimeoutError("t", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[])))[1] is None
    assert failure_of(wrapped(CancelledError("c"))) == ("cancelled", None)


@pytest.mark.parametrize("limit, gives_up", [(8, True), (None, False)])
def test_the_simulator_gives_up_as_the_workflow_does(limit: int | None, gives_up: bool) -> None:
    task = frozenlake_task(group_size=2, max_turns=2)
    training = TrainingConfig(steps=2, batch_size=4, fail_after_failures=limit)
    setup = Setup(
        name="failing",
        plan=TrainingPlan.of(JobSpec(name="f", tasks=[task], training=training)),
        pools=[PoolSpec("h800", "h800", 1)],
        model=MODELS["7b"],
        profiles={"frozenlake": TaskProfile("frozenlake", step_failure_p=1.0, prompt_tokens=32)},  # every step raises
        trainer=TrainerModel(fixed_s=1.0),
        seed=0,
        horizon_s=20.0,
    )
    out, _ = simulate(setup)
    if gives_up:
        assert out.gave_up is not None and "failed with EnvBroken" in out.gave_up and out.state.failed >= 8
        assert out.state.step == 0
    else:
        assert out.gave_up is None and out.state.failed > 8  # it launches on until its horizon


def test_a_failed_job_is_one_line_and_exit_code_1_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import importlib

    from temporalio.client import WorkflowFailureError

    cli_main = importlib.import_module("rollart.cli.main")

    why = "job j is failing: 32 trajectories in a row failed with InvalidInput and none completed since"
    failure = WorkflowFailureError(cause=ErrorType.JOB_FAILING.error(why))

    def train(args: argparse.Namespace) -> int:
        raise failure

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=train, verbose=False)
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    assert cli_main.run([]) == 1
    assert capsys.readouterr().err.strip() == f"error: the job failed: JobFailing: {why}"
