"""Arithmetic env: reasoning-gym problems as compact prompts, exact-match rewards, argument checks, registration."""

from __future__ import annotations

import json
import re
import time

import pytest

from rollart.activities.envs.arithmetic import Arithmetic, is_integer, render
from rollart.activities.rewards.rule_based import exact_match
from rollart.contracts.activities import Transcript, TurnRecord
from rollart.spec.env import Env
from rollart.spec.registry import lookup_env

PROMPT = re.compile(r"(-?[0-9]+)([+\-*][0-9]+)+=")


def expected(prompt: str) -> str:
    """The answer by Python's own arithmetic (integers, usual precedence)."""
    return str(eval(prompt.removesuffix("=")))


def test_registered_under_arithmetic() -> None:
    entry = lookup_env("arithmetic")
    assert entry.cls is Arithmetic and issubclass(Arithmetic, Env)


def test_prompt_format_and_determinism() -> None:
    a, b = Arithmetic(), Arithmetic()
    prompts = [a.reset(seed) for seed in range(50)]
    assert prompts == [b.reset(seed) for seed in range(50)]
    assert len(set(prompts)) > 10  # seeds give different problems
    for p in prompts:
        assert PROMPT.fullmatch(p) and " " not in p, p
        x, y = p.removesuffix("=").split("+")
        assert 0 <= int(x) <= 10 and 0 <= int(y) <= 10  # reasoning-gym's 1-digit operands are 0..10
    assert render("3 + 4") == "3+4="


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"operators": "+-", "num_terms": 3},
        {"operators": "-"},
        {"operators": "*", "min_digits": 1, "max_digits": 2},
        {"min_digits": 2, "max_digits": 3, "num_terms": 4},
    ],
)
def test_answers_are_correct_for_200_seeds(args: dict) -> None:
    lake = Arithmetic(**args)
    for seed in range(200):
        prompt = lake.reset(seed)
        assert PROMPT.fullmatch(prompt), prompt
        assert prompt.count("+") + prompt.count("-") + prompt.count("*") >= args.get("num_terms", 2) - 1
        assert lake.answer == expected(prompt), (seed, prompt, lake.answer)


def test_right_wrong_and_garbage_actions() -> None:
    arith = Arithmetic()
    prompt = arith.reset(7)
    answer = expected(prompt)
    out = arith.step(f"  {answer}\n")
    assert (out.reward, out.done) == (1.0, True)
    assert out.info == {"answer": answer, "success": True, "valid": True}
    json.dumps(out.info)

    arith.reset(7)
    out = arith.step(str(int(answer) + 1))
    assert (out.reward, out.done, out.info["success"], out.info["valid"]) == (0.0, True, False, True)

    for garbage in ("", "seven", f"{answer}{answer}x", f"{answer} apples", "1.0"):
        arith.reset(7)
        out = arith.step(garbage)
        assert (out.reward, out.done, out.info["success"], out.info["valid"]) == (0.0, True, False, False), garbage

    arith.reset(7)
    out = arith.step(f"{answer}0")  # contains the answer but is not it: no partial credit
    assert out.reward == 0.0 and out.info["valid"]


def test_negative_answers_are_valid_integers() -> None:
    arith = Arithmetic(operators="-")
    for seed in range(50):
        prompt = arith.reset(seed)
        if expected(prompt).startswith("-"):
            out = arith.step(expected(prompt))
            assert out.reward == 1.0 and out.info["valid"]
            return
    pytest.fail("no negative answer in 50 seeds")


def test_step_order_is_enforced() -> None:
    arith = Arithmetic()
    with pytest.raises(RuntimeError, match="reset"):
        arith.step("1")
    arith.reset(0)
    arith.step("1")
    with pytest.raises(RuntimeError, match="after the episode ended"):
        arith.step("1")
    with pytest.raises(TypeError, match="seed"):
        arith.reset("0")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"min_digits": 0}, "min_digits"),
        ({"max_digits": 10}, "max_digits"),
        ({"min_digits": 3, "max_digits": 2}, "max_digits"),
        ({"min_digits": True}, "min_digits"),
        ({"num_terms": 1}, "num_terms"),
        ({"num_terms": "2"}, "num_terms"),
        ({"operators": "/"}, "operators"),
        ({"operators": "+*"}, "operators"),
        ({"operators": ""}, "operators"),
        ({"operators": ["+"]}, "operators"),
        ({"operator": "+"}, "operator"),
    ],
)
def test_bad_args_raise_value_error_naming_the_arg(args: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Arithmetic(**args)


def test_is_integer() -> None:
    assert all(is_integer(t) for t in ("0", "7", "-12", "+3", "0012"))
    assert not any(is_integer(t) for t in ("", "-", "1.5", "1_000", "٣", "1 2"))


def test_exact_match_scores_a_transcript() -> None:
    arith = Arithmetic()
    prompt = arith.reset(3)
    turns = []
    for action in (expected(prompt), "nope"):
        arith.reset(3)
        out = arith.step(action)
        turns.append(TurnRecord(observation=prompt, action=action, env_reward=out.reward, done=out.done, info=out.info))
    right = exact_match(Transcript(task="arith", seed=3, turns=[turns[0]]))
    wrong = exact_match(Transcript(task="arith", seed=3, turns=[turns[1]]))
    assert (right.value, right.success) == (1.0, True)
    assert (wrong.value, wrong.success) == (0.0, False)


def test_reset_is_fast() -> None:
    arith = Arithmetic()
    arith.reset(0)  # first use imports reasoning-gym
    t0 = time.perf_counter()
    for seed in range(1000):
        arith.reset(seed)
    assert (time.perf_counter() - t0) / 1000 < 1e-3  # ~15-30 µs measured; 1 ms leaves room for a busy machine
