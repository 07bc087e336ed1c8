"""The tool-use env and its sandbox: safe calculator parsing, limits that cut off runaway calls, episodes.

Unit tests cover what runs in-process (parsing, problems, answers, invalid actions, refused
expressions); the tests that run tool calls start child processes and are `integration`, as is
the `rollart rollout` run on the session's local stack.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest

from rollart.activities.envs import sandbox_isolation
from rollart.activities.envs.sandbox import (
    CalcError,
    SandboxLimits,
    SandboxMode,
    SandboxUnavailable,
    check_expression,
    run_calc,
    run_python,
)
from rollart.activities.envs.sandbox_isolation import BwrapLayout, BwrapProbe
from rollart.activities.envs.tool_use import ToolUse, make_problem, parse_action
from rollart.spec.checks import JobCheckError, check_job_components
from rollart.spec.config import JobSpec, TaskSpec
from rollart.spec.registry import lookup_env
from rollart.workers.local_stack import LocalStack
from tests.support.cli import rollart

FAST = SandboxLimits(time_limit_s=1.0, cpu_limit_s=1, memory_mb=256, max_output_chars=200)
FAKE_LAYOUT = BwrapLayout(bwrap="/usr/bin/bwrap", python="/usr/bin/python3.11", ro_dirs=("/usr",))


@pytest.fixture(autouse=True)
def _unit_tests_see_a_working_bubblewrap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a tool_use env with python probes bubblewrap (a process); unit tests get a probe that says it works."""
    if request.node.get_closest_marker("integration") is None:
        monkeypatch.setattr(sandbox_isolation, "bubblewrap", lambda: BwrapProbe(FAKE_LAYOUT))


def _mode(mode: SandboxMode) -> SandboxMode:
    """`mode`, or a skip where it needs bubblewrap and bubblewrap cannot run here."""
    if mode != "unsafe_process" and sandbox_isolation.bubblewrap().layout is None:
        pytest.skip(f"bubblewrap cannot run here: {sandbox_isolation.bubblewrap().why}")
    return mode


BOTH = pytest.mark.parametrize("mode", ["auto", "unsafe_process"])


# --- unit: nothing here starts a process ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "canonical"),
    [
        ("4821*37", "4821 * 37"),
        ("(1 + 2) * -3", "(1 + 2) * -3"),
        ("2 ** 0.5", "2 ** 0.5"),
        ("7 // 2 % 3", "7 // 2 % 3"),
        ("1 + 2  # a comment", "1 + 2"),
        ("10 / 4", "10 / 4"),
    ],
)
def test_calculator_accepts_numbers_and_arithmetic(expression: str, canonical: str) -> None:
    assert check_expression(expression) == canonical


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("x + 1", "names are not allowed ('x')"),
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("(1).real", "attributes are not allowed (.real)"),
        ("'a' * 3", "not str"),
        ("True + 1", "not bool"),
        ("1j * 2", "not complex"),
        ("[1, 2][0]", "is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 +", "not an arithmetic expression"),
        ("1+" * 300 + "1", "longer than 500"),
    ],
)
def test_calculator_refuses_names_attributes_and_anything_else(expression: str, message: str) -> None:
    with pytest.raises(CalcError, match=re.escape(message)):
        check_expression(expression)


def test_a_refused_expression_returns_an_error_without_running_anything() -> None:
    result = run_calc("os.sep", FAST)  # the unit tier's spawn guard fails this test if it starts a process
    assert result.reason == "error" and result.exit_code is None and "attributes are not allowed" in result.stderr_tail
    assert (
        result.error_line(FAST)
        == "error: calc: attributes are not allowed (.sep); use numbers and + - * / // % ** only"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("time_limit_s", 0),
        ("time_limit_s", 60),
        ("cpu_limit_s", 0.5),
        ("memory_mb", 8),
        ("memory_mb", 256.0),
        ("max_output_chars", 0),
        ("max_output_chars", True),
    ],
)
def test_limits_are_checked_and_name_the_argument(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SandboxLimits(**{field: value})


def test_parse_action_takes_the_first_tag_and_allows_a_missing_close() -> None:
    call = parse_action("think <calc> 3*4 </calc> then <answer>12</answer>")
    assert call is not None and (call.kind, call.content) == ("calc", "3*4")
    call = parse_action("<python>print(1)\nprint(2)")  # sampling stopped at </python>
    assert call is not None and (call.kind, call.content) == ("python", "print(1)\nprint(2)")
    call = parse_action("so <answer> 42 </answer>")
    assert call is not None and (call.kind, call.content) == ("answer", "42")
    assert parse_action("42") is None and parse_action("<calculator>1</calculator>") is None


def test_problems_are_deterministic_and_their_answers_right() -> None:
    for seed in range(50):
        expression, value = make_problem(seed, digits=4, num_terms=4, operators="+-*")
        assert make_problem(seed, 4, 4, "+-*") == (expression, value)
        assert re.fullmatch(r"[0-9]{4}([+*-][0-9]{4}){3}", expression)
        assert value == eval(expression)  # digits and + - * only, checked just above
    assert make_problem(1, 3, 2, "*") != make_problem(2, 3, 2, "*")


def _env(**args: object) -> ToolUse:
    env = lookup_env("tool_use").cls(**args)
    assert isinstance(env, ToolUse)
    return env


def test_a_correct_answer_succeeds_and_ends_the_episode() -> None:
    env = _env()
    first = env.reset(7)
    expression, value = make_problem(7, 3, 2, "*")
    assert first.startswith(f"Compute {expression}. Tools: <calc>") and "<answer>" in first
    out = env.step(f"I think <answer>{value:,}</answer>")  # thousands separators are fine
    assert out.done and out.reward == 1.0
    assert out.info["success"] is True and out.info["valid"] is True and out.info["answer"] == str(value)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("<answer>1</answer>")
    env.reset(7)
    wrong = env.step(f"<answer>{value + 1}</answer>")
    assert wrong.done and wrong.reward == 0.0 and wrong.info["success"] is False and wrong.info["valid"] is True
    env.reset(7)
    junk = env.step("<answer>about twelve</answer>")
    assert junk.done and junk.info["success"] is False and junk.info["valid"] is False


def test_text_without_a_tag_is_invalid_and_the_episode_goes_on() -> None:
    env = _env(tools=["calc"])
    env.reset(0)
    out = env.step("hello there")
    assert not out.done and out.reward == 0.0 and out.info["valid"] is False and out.info["tool"] is None
    assert out.observation.endswith("hello there\nerror: no <calc>, <answer> tag\n")
    disabled = env.step("<python>print(1)</python>")  # python is not enabled: invalid, nothing runs
    assert (
        disabled.info["valid"] is False
        and "error: tool python is not enabled; use <calc>, <answer>" in disabled.observation
    )
    ended = _env(invalid_action="end")
    ended.reset(0)
    assert ended.step("hello").done


def test_a_refused_calculator_call_is_an_error_observation() -> None:
    env = _env()
    env.reset(0)
    out = env.step("<calc>x*2</calc>")
    assert not out.done and out.info["valid"] is True and out.info["tool"] == "calc"
    assert out.info["reason"] == "error" and out.info["tool_calls"] == 1
    assert out.observation.endswith(
        "<calc>x*2</calc>\nerror: calc: names are not allowed ('x'); use numbers and + - * / // % ** only\n"
    )
    json.dumps(out.info)


def test_observations_stay_within_their_bound_and_ascii() -> None:
    env = _env(max_observation_chars=240)
    first = env.reset(3)
    for i in range(20):
        out = env.step(f"turn {i} \u00e9\u4e2d")
        assert len(out.observation) <= 240 and out.observation.isascii()
        assert out.observation.startswith(first)  # the question is always kept
    assert "turn 19 ??\n" in out.observation and "turn 0 " not in out.observation  # the oldest dropped first
    assert out.observation[len(first) :].startswith("...\n")
    long = env.step("blah " * 100)  # longer than the room left: its end, with the error line, is kept
    assert len(long.observation) == 240 and long.observation.endswith("...\nerror: no <calc>, <python>, <answer> tag\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"digits": 0}, "digits"),
        ({"num_terms": 1}, "num_terms"),
        ({"operators": "/"}, "operators"),
        ({"tools": ["shell"]}, "tools"),
        ({"tools": []}, "tools"),
        ({"tools": "calc"}, "tools"),
        ({"time_limit_s": 100}, "time_limit_s"),
        ({"memory_mb": 1}, "memory_mb"),
        ({"max_observation_chars": 50}, "max_observation_chars"),
        ({"invalid_action": "stop"}, "invalid_action"),
        ({"timeout": 3}, "unknown env_args"),
    ],
)
def test_bad_env_args_are_refused_naming_the_argument(args: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _env(**args)


def test_python_tools_are_refused_where_bubblewrap_cannot_run_unless_the_task_opts_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox_isolation, "bubblewrap", lambda: BwrapProbe(None, "bubblewrap is not installed"))
    monkeypatch.setattr(sandbox_isolation, "network_isolation", lambda: "netns")
    for mode in ("auto", "bubblewrap"):
        with pytest.raises(SandboxUnavailable) as refused:
            _env(sandbox=mode)
        message = str(refused.value)
        assert message.startswith(f"tool_use: sandbox {mode!r}: python tool calls run model-written code")
        assert "bubblewrap is not installed" in message and "install bubblewrap" in message
        assert "user namespaces" in message and "env_args.sandbox: unsafe_process" in message
    assert _env(tools=["calc"]).tools == ("calc",)  # the calculator runs no code: it works without bubblewrap
    assert _env(sandbox="unsafe_process").sandbox == "unsafe_process"  # the opt-in by name
    with pytest.raises(ValueError, match="sandbox must be one of 'auto', 'bubblewrap', 'unsafe_process'"):
        _env(sandbox="none")
    with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
        run_python("print(1)", FAST)  # a direct call refuses too, before running anything


def test_a_job_with_python_tools_is_refused_at_load_where_bubblewrap_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox_isolation, "bubblewrap", lambda: BwrapProbe(None, "bubblewrap is not installed"))
    task = {"name": "tool_use", "env": "tool_use", "reward": "success", "generate_pool": "h800", "max_turns": 3}
    with pytest.raises(JobCheckError, match=r"tasks.0 \(tool_use\): env: tool_use: sandbox 'auto'.*unsafe_process"):
        check_job_components(JobSpec(tasks=[TaskSpec.model_validate(task)]))
    calc_only = {**task, "env_args": {"tools": ["calc"]}}
    check_job_components(JobSpec(tasks=[TaskSpec.model_validate(calc_only)]))


# --- integration: tool calls in child processes --------------------------------------------------------------------


@pytest.mark.integration
@BOTH
def test_python_output_and_calculator_values_come_back(mode: SandboxMode) -> None:
    ok = run_python("import math\nprint(math.factorial(20))\nprint('done')", FAST, _mode(mode))
    assert (ok.reason, ok.exit_code, ok.stdout) == ("ok", 0, "2432902008176640000\ndone\n")
    expected = ("bwrap",) if mode == "auto" else ("netns", "sockets_disabled")
    assert ok.isolation in expected and ok.wall_s < 5
    failed = run_python("print('partial')\nraise KeyError('k')", FAST, mode)
    assert failed.reason == "error" and failed.exit_code == 1 and failed.stdout == "partial\n"
    assert failed.error_line(FAST) == "error: KeyError: 'k'"
    assert run_calc("4821*37", FAST).stdout == "178377\n"
    assert run_calc("(2 + 3) ** 2 / 5", FAST).stdout == "5.0\n"
    assert run_calc("1/0", FAST).error_line(FAST) == "error: ZeroDivisionError: division by zero"


@pytest.mark.integration
@BOTH
@pytest.mark.parametrize("code", ["while True: pass", "import time\ntime.sleep(600)"])
def test_a_call_that_never_ends_is_cut_off_by_the_limits(code: str, mode: SandboxMode) -> None:
    start = time.monotonic()
    result = run_python(code, FAST, _mode(mode))
    assert time.monotonic() - start < FAST.time_limit_s + 3
    assert result.reason in ("timeout", "cpu_limit")
    assert result.error_line(FAST) in ("error: timed out after 1 s", "error: CPU time limit of 1 s exceeded")


@pytest.mark.integration
@BOTH
def test_allocating_10_gib_is_cut_off_by_the_memory_limit(mode: SandboxMode) -> None:
    start = time.monotonic()
    result = run_python("blob = bytearray(10 * 1024**3)\nprint('allocated')", FAST, _mode(mode))
    assert time.monotonic() - start < 5
    assert result.reason == "memory_limit" and result.stdout == "" and "MemoryError" in result.stderr_tail
    assert result.error_line(FAST) == "error: memory limit of 256 MB exceeded"


@pytest.mark.integration
@BOTH
def test_huge_output_is_truncated_and_stops_the_call(mode: SandboxMode) -> None:
    start = time.monotonic()
    result = run_python("while True:\n    print('x' * 10000)", FAST, _mode(mode))
    assert time.monotonic() - start < FAST.time_limit_s + 3
    assert result.reason == "output_limit" and result.truncated and result.stdout == "x" * FAST.max_output_chars
    flood = run_python("import sys\nwhile True:\n    sys.stderr.write('y' * 10000)", FAST, mode)
    assert flood.reason == "output_limit" and len(flood.stderr_tail) <= 1000


@pytest.mark.integration
@pytest.mark.parametrize("mechanism", ["netns", "sockets_disabled"])
def test_the_network_is_unreachable_from_a_tool_call(mechanism: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unsafe mode's two mechanisms; bubblewrap's (and routes round the sockets guard): test_sandbox_escapes.py."""
    if mechanism == "netns" and sandbox_isolation.network_isolation() != "netns":
        pytest.skip("no user namespaces here: the sandbox falls back to disabling sockets")
    monkeypatch.setattr(sandbox_isolation, "network_isolation", lambda: mechanism)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
        result = run_python(code, FAST, "unsafe_process")
        assert result.isolation == mechanism and result.reason == "error" and "connected" not in result.stdout
        expected = "Network is unreachable" if mechanism == "netns" else "network access is disabled"
        assert expected in result.stderr_tail
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever reached the listener


@pytest.mark.integration
def test_processes_a_call_leaves_behind_are_killed(tmp_path: Path) -> None:
    """In the unsafe mode's netns (which can write the host's files, so the orphan's heartbeat is seen here)."""
    if sandbox_isolation.network_isolation() != "netns":
        pytest.skip("only the pid namespace (with the network namespace) kills a process that left the process group")
    beat = tmp_path / "beat"
    code = (
        f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    for _ in range(600):\n"
        f"        open({str(beat)!r}, 'a').write('.')\n        time.sleep(0.05)\n"
        f"else:\n    time.sleep(0.3)\n    print('parent done')"
    )
    result = run_python(code, FAST, "unsafe_process")
    assert result.reason == "ok" and result.stdout == "parent done\n"
    assert beat.exists()  # the orphan ran, in its own session...
    size = beat.stat().st_size
    time.sleep(0.5)
    assert beat.stat().st_size == size  # ...and died with the call


@pytest.mark.integration
def test_an_episode_with_tool_calls_a_timeout_and_an_answer() -> None:
    _mode("auto")
    env = _env(time_limit_s=1.0, cpu_limit_s=1)
    env.reset(11)
    expression, value = make_problem(11, 3, 2, "*")
    calc = env.step(f"<calc>{expression}</calc>")
    assert not calc.done and calc.reward == 0.0 and calc.observation.endswith(f"<calc>{expression}</calc>\n{value}\n")
    assert calc.info["reason"] == "ok" and calc.info["tool"] == "calc" and isinstance(calc.info["wall_s"], float)
    start = time.monotonic()
    hung = env.step("<python>while True:\n    pass</python>")
    assert time.monotonic() - start < 1.0 + 3
    assert not hung.done and hung.info["reason"] in ("timeout", "cpu_limit") and hung.info["valid"] is True
    assert re.search(r"error: (timed out after 1 s|CPU time limit of 1 s exceeded)\n$", hung.observation)
    big = env.step("<python>x = bytearray(10 * 1024**3)</python>")
    assert not big.done and big.info["reason"] == "memory_limit"
    assert big.observation.endswith("error: memory limit of 256 MB exceeded\n")
    py = env.step(f"<python>print({expression})</python>")
    assert py.observation.endswith(f"{value}\n") and py.info["tool_calls"] == 4
    assert f"<calc>{expression}</calc>\n{value}\n" in py.observation  # earlier calls are still shown
    done = env.step(f"<answer>{value}</answer>")
    assert done.done and done.reward == 1.0 and done.info["success"] is True
    json.dumps([calc.info, hung.info, big.info, py.info, done.info])


@pytest.mark.integration
def test_rollout_cli_runs_tool_use_episodes_on_the_stack(
    capsys: pytest.CaptureFixture[str], stack: LocalStack, stack_job: JobSpec, tmp_path: Path
) -> None:
    _mode("auto")  # the job's python tool needs bubblewrap, here (`rollart rollout` checks) and on the workers
    task = TaskSpec.model_validate(
        {
            "name": "tool_use",
            "env": "tool_use",
            "reward": "success",
            "generate_pool": "h800",
            "max_turns": 3,
            "env_args": {"max_observation_chars": 200, "time_limit_s": 1.0},
            "sampling": {"max_tokens": 16},
        }
    )  # prompts within the stack's max_model_len (256): 200 ASCII chars + 16 new tokens
    job = stack_job.model_copy(update={"name": "tooluse", "tasks": [task]})
    job_file = tmp_path / "job.json"
    job_file.write_text(job.model_dump_json())
    done = rollart(capsys, "rollout", str(job_file), "-n", "4", "--temporal-address", stack.address)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4/4 completed" in done.stdout
    job_id = re.search(r"job (tooluse-\S+): starting", done.stdout)
    assert job_id is not None, done.stdout
    turns = sorted((stack_job.store.path / "trajectories" / job_id.group(1)).glob("*/turn-*"))
    prompts = [json.loads(p.read_text())["prompt"] for p in turns]
    assert prompts and all(p.startswith("Compute ") and len(p) <= 200 for p in prompts)
    later = [p for p, path in zip(prompts, turns, strict=True) if path.name != "turn-000"]
    # the tiny random policy rarely writes a tag: every later prompt still shows the env's reply to its last action
    assert later and all("\nerror: " in p or "</calc>\n" in p or "</python>\n" in p for p in later)
