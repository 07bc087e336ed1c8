"""Entropy over an env's actions (`trainer.loss.entropy_over: actions`): the classes read from the tokenizer, the
value and gradient by hand, per-task rows, a real train step, and the errors for envs that declare no actions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from transformers import AutoTokenizer

from rollart.activities.envs.arithmetic import Arithmetic
from rollart.activities.envs.frozenlake import FrozenLake
from rollart.activities.envs.tool_use import ToolUse
from rollart.activities.rl.action_entropy import (
    ActionSpace,
    ActionTerm,
    UnknownActions,
    action_space,
    load_action_spaces,
    token_action_entropy,
)
from rollart.activities.trainer import TrainerActivities
from rollart.contracts.training import TrainingPlan
from rollart.infra.store.payload import LocalStore
from rollart.spec.checks import JobCheckError, check_job_components
from rollart.spec.config import JobSpec, LossConfig, TaskEnv
from rollart.spec.env import declares_actions
from rollart.workflows.entropy_control import measured
from tests.support.batches import frozenlake_batch, load_model
from tests.test_trainer import step_input

# Two actions, "a" spelled by tokens 0 and 1, "b" by token 2; tokens 3 and 4 are no action.
SPACE = ActionSpace(("a", "b"), torch.tensor([0, 0, 1, 2, 2]))


def entropy(q: list[float]) -> float:
    return -sum(p * math.log(p) for p in q if p > 0)


def test_the_entropy_is_over_actions_renormalised_and_blind_to_how_a_move_is_spelled() -> None:
    # uniform logits: P(a) = 2/5, P(b) = 1/5, no action 2/5 -> q = (2/3, 1/3)
    h = token_action_entropy(torch.zeros(1, 2, 5), ["t"], ActionTerm({"t": SPACE}))
    assert h[0, 0] == 0.0  # position 0 predicts nothing, as for the log-probs
    assert h[0, 1].item() == pytest.approx(entropy([2 / 3, 1 / 3]), abs=1e-6)
    # all of a's mass on one of its two tokens, and more mass on no action: the same q, the same entropy
    # (the distribution at position 0 is the one that sampled token 1: its entropy is reported at position 1)
    logits = torch.tensor([[[math.log(2.0), -30.0, 0.0, 3.0, 3.0], [0.0] * 5]])
    assert token_action_entropy(logits, ["t"], ActionTerm({"t": SPACE}))[0, 1].item() == pytest.approx(
        entropy([2 / 3, 1 / 3]), abs=1e-5
    )
    one_move = torch.tensor([[[0.0, 0.0, -60.0, 0.0, 0.0], [0.0] * 5]])
    assert token_action_entropy(one_move, ["t"], ActionTerm({"t": SPACE}))[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_its_gradient_moves_mass_to_the_rarer_action_and_leaves_no_action_tokens_alone() -> None:
    logits = torch.zeros(1, 2, 5, requires_grad=True)
    token_action_entropy(logits, ["t"], ActionTerm({"t": SPACE}))[0, 1].backward()
    g = logits.grad[0, 0].tolist()
    # d/dz of H(q) with q = (2/3, 1/3): the rare action's token goes up, the common one's two tokens down
    assert g[2] > 0 and g[0] < 0 and g[1] < 0 and g[0] == pytest.approx(g[1])
    # no action: 0 up to float rounding (their softmax mass cancels out of q only in exact arithmetic: a bound of
    # 1e-7 against gradients of ~0.1 still says they are left alone); the last position predicts none: exactly 0
    assert g[3] == pytest.approx(0.0, abs=1e-7) and g[4] == pytest.approx(0.0, abs=1e-7)
    assert logits.grad[0, 1].abs().sum().item() == 0
    assert g[2] == pytest.approx(-2 * g[0], abs=1e-7)  # the three action tokens' gradients sum to 0


def test_coverage_is_minus_kl_from_uniform_and_its_pull_on_a_vanishing_action_does_not_fade() -> None:
    cover = ActionTerm({"t": SPACE}, form="coverage")
    h = token_action_entropy(torch.zeros(1, 2, 5), ["t"], cover)
    assert h[0, 1].item() == pytest.approx(0.5 * (math.log(2 / 3) + math.log(1 / 3)) + math.log(2), abs=1e-6)
    assert cover.metric == "action_coverage" and ActionTerm({"t": SPACE}).metric == "action_entropy"
    for form, fades in (("entropy", True), ("coverage", False)):
        pulls = []
        for rare in (-4.0, -8.0, -12.0):  # action b ever less likely
            logits = torch.tensor([[[0.0, 0.0, rare, 0.0, 0.0], [0.0] * 5]], requires_grad=True)
            token_action_entropy(logits, ["t"], ActionTerm({"t": SPACE}, form))[0, 1].backward()
            pulls.append(logits.grad[0, 0, 2].item())
        assert all(p > 0 for p in pulls)
        if fades:  # q log q -> 0: the bonus stops helping exactly where it is needed
            assert pulls[2] < 0.01 * pulls[0]
        else:  # -> 1/C of the bonus: the rare action keeps being pulled up
            assert pulls[2] == pytest.approx(0.5, abs=1e-3) and pulls[0] > 0.49


def test_rows_of_different_tasks_read_tokens_as_their_own_actions() -> None:
    other = ActionSpace(("x", "y", "z"), torch.tensor([0, 1, 2, 3, 3]))  # tokens 0..2 are three actions
    h = token_action_entropy(torch.zeros(3, 2, 5), ["t", "u", "t"], ActionTerm({"t": SPACE, "u": other}))
    assert h[0, 1].item() == pytest.approx(entropy([2 / 3, 1 / 3]), abs=1e-6) and h[2, 1] == h[0, 1]
    assert h[1, 1].item() == pytest.approx(math.log(3), abs=1e-6)
    with pytest.raises(UnknownActions, match="task 'v' has no action space"):
        token_action_entropy(torch.zeros(1, 2, 5), ["v"], ActionTerm({"t": SPACE}))


def test_the_tiny_models_tokens_read_as_frozenlakes_moves_and_arithmetics_numbers(tiny_model: Path) -> None:
    spaces = load_action_spaces(str(tiny_model), {"fl": TaskEnv(env="frozenlake"), "ar": TaskEnv(env="arithmetic")})
    tok = AutoTokenizer.from_pretrained(tiny_model)
    fl = spaces["fl"]
    assert sorted(fl.names) == ["D", "L", "R", "U"]
    for token in range(len(tok)):
        text = tok.decode([token])
        cls = int(fl.token_class[token])
        assert (fl.names[cls] if cls < 4 else None) == FrozenLake().action_of(text), (token, text)
    ar = spaces["ar"]
    assert sorted(ar.names, key=int) == [str(n) for n in range(21)]  # the answers of 1-digit sums, each one token
    assert ar.token_class[tok.convert_tokens_to_ids("7")] == ar.names.index("7")
    assert ar.token_class[tok.convert_tokens_to_ids("57")] == len(ar.names)  # a number no sum here has: no action
    assert Arithmetic().action_of(" 07 ") == "7" and Arithmetic().action_of("7x") is None


@pytest.mark.parametrize(
    ("env_args", "low", "high"),
    [
        ({}, 0, 20),
        ({"operators": "-", "num_terms": 3}, -20, 10),
        ({"operators": "+-"}, -10, 20),
        ({"operators": "*", "num_terms": 3}, 0, 1000),
        ({"min_digits": 1, "max_digits": 2}, 0, 200),
    ],
)
def test_arithmetics_actions_are_the_answers_its_problems_can_have(env_args: dict, low: int, high: int) -> None:
    env = Arithmetic(**env_args)
    assert env.answer_range == (low, high)
    assert env.action_of(str(low)) == str(low) and env.action_of(str(high)) == str(high)
    assert env.action_of(str(low - 1)) is None and env.action_of(str(high + 1)) is None
    answers = set()
    for seed in range(400):  # every problem reasoning-gym draws has its answer in the range
        env.reset(seed)
        answers.add(int(env.answer))
    assert low <= min(answers) and max(answers) <= high


def test_an_env_with_fewer_than_two_actions_or_none_declared_is_refused() -> None:
    with pytest.raises(UnknownActions, match="reads 1 action"):
        action_space(FrozenLake(), lambda t: "R" if t == 0 else "x", 5, "task 't'")
    assert declares_actions(FrozenLake) and declares_actions(Arithmetic) and not declares_actions(ToolUse)
    with pytest.raises(UnknownActions, match="no task envs"):
        load_action_spaces("unused", {})


def test_the_plan_carries_task_envs_only_when_entropy_is_over_actions() -> None:
    tasks = [{"name": "fl", "env": "frozenlake", "env_args": {"maps": "standard"}, "reward": "success"}]
    plain = JobSpec(tasks=tasks)
    assert TrainingPlan.of(plain).trainer.task_envs == {}  # other jobs' histories carry nothing new
    actions = JobSpec(tasks=tasks, trainer={"loss": {"entropy_over": "actions", "entropy_coef": 0.01}})
    assert TrainingPlan.of(actions).trainer.task_envs == {
        "fl": TaskEnv(env="frozenlake", env_args={"maps": "standard"})
    }
    assert measured(actions.trainer.loss) == "action_entropy" and measured(LossConfig()) == "entropy"


def test_coverage_is_refused_over_tokens_and_with_an_entropy_target() -> None:
    with pytest.raises(ValidationError, match="set entropy_over: actions"):
        LossConfig(action_bonus="coverage")
    with pytest.raises(ValidationError, match="entropy_target controls an entropy"):
        LossConfig(entropy_over="actions", action_bonus="coverage", entropy_target=0.1)
    LossConfig(entropy_over="actions", action_bonus="coverage", entropy_coef=0.01)


def test_a_job_whose_env_declares_no_actions_is_refused_before_it_starts() -> None:
    tasks = [
        {"name": "calc", "env": "tool_use", "reward": "env_return", "env_args": {"tools": ["calc"]}},  # no sandbox
        {"name": "fl", "env": "frozenlake", "reward": "success"},
    ]
    job = JobSpec(tasks=tasks, trainer={"loss": {"entropy_over": "actions"}})
    with pytest.raises(JobCheckError, match=r"tasks.0 \(calc\): trainer.loss.entropy_over: actions.*'tool_use'") as err:
        check_job_components(job)
    assert "tasks.1" not in str(err.value)
    check_job_components(job.model_copy(update={"tasks": job.tasks[1:]}))


@pytest.mark.parametrize("form", ["entropy", "coverage"])
async def test_a_train_step_puts_its_bonus_on_the_actions(tiny_model: Path, tmp_path: Path, form: str) -> None:
    store = LocalStore(tmp_path / "store")
    tok = AutoTokenizer.from_pretrained(tiny_model)
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    env = ActivityEnvironment()
    envs = {"frozenlake": TaskEnv(env="frozenlake")}
    metric = f"action_{form}"
    results = {}
    for coef in (0.0, 0.5):
        loss = LossConfig(entropy_over="actions", action_bonus=form, entropy_coef=coef)
        inp = step_input(tiny_model, tmp_path / f"run-{coef}", 0, samples, loss=loss, task_envs=envs)
        results[coef] = (await env.run(TrainerActivities(store).train_step, inp)).metrics
    for m in results.values():
        assert "entropy" not in m and (0.0 < m[metric] < math.log(4) if form == "entropy" else m[metric] < 0.0)
    assert results[0.0][metric] == pytest.approx(results[0.5][metric])  # measured before the update
    assert results[0.5]["loss"] == pytest.approx(results[0.0]["loss"] - 0.5 * results[0.0][metric], abs=1e-5)

    bad = step_input(
        tiny_model,
        tmp_path / "run-bad",
        0,
        samples,
        loss=LossConfig(entropy_over="actions"),
        task_envs={"frozenlake": TaskEnv(env="tool_use")},
    )
    with pytest.raises(ApplicationError) as err:
        await env.run(TrainerActivities(store).train_step, bad)
    assert err.value.type == "InvalidInput" and err.value.non_retryable
    assert (
        "entropy_over: actions" in err.value.message and "'tool_use' does not declare its actions" in err.value.message
    )


async def test_with_bonus_on_unsolved_a_step_puts_the_bonus_only_on_groups_without_a_success(
    tiny_model: Path, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), AutoTokenizer.from_pretrained(tiny_model))
    samples = [
        s.model_copy(update={"success": s.group_id == "g1", "reward": float(s.group_id == "g1")}) for s in samples
    ]
    env = ActivityEnvironment()
    metrics = {}
    for bonus_on in ("all", "unsolved"):
        loss = LossConfig(entropy_coef=0.5, bonus_on=bonus_on)
        inp = step_input(tiny_model, tmp_path / f"run-{bonus_on}", 0, samples, loss=loss)
        metrics[bonus_on] = (await env.run(TrainerActivities(store).train_step, inp)).metrics
    assert metrics["all"]["bonus_share"] == 1.0
    assert metrics["unsolved"]["bonus_share"] == pytest.approx(13 / 17)  # g1 (4 of the 17 sequences) solved
    assert metrics["all"]["entropy"] == pytest.approx(metrics["unsolved"]["entropy"])  # reported over all tokens
    assert metrics["unsolved"]["loss"] > metrics["all"]["loss"]  # less bonus subtracted
