"""The `gem` env: GEM (gem-llm) ids driven through rollart's Env contract, and a rollout of examples/sokoban.yaml."""

from __future__ import annotations

import json
import random
import re
from collections import deque
from pathlib import Path

import pytest

from rollart.activities.envs.gem_env import GemEnv
from rollart.activities.rewards.rule_based import env_return
from rollart.contracts.activities import Transcript, TurnRecord
from rollart.spec.config import JobSpec, load_job
from rollart.spec.registry import lookup_env, lookup_reward
from rollart.workers.local_stack import LocalStack
from tests.support.cli import rollart
from tests.support.paths import REPO

pytest.importorskip("gem", reason="the gem env needs gem-llm (`make setup` installs it)")

SOKOBAN = "game:Sokoban-v0-easy"
GUESS = "game:GuessTheNumber-v0-easy"
HANOI = "game:TowerofHanoi-v0-easy"
RG = "rg:basic_arithmetic"
BOXED = "\\boxed{{{action}}}"
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def sokoban(**env_args: object) -> GemEnv:
    return GemEnv(id=SOKOBAN, action_format=BOXED, **env_args)


def board(observation: str) -> list[list[str]]:
    """The last board in a Sokoban prompt, as rows of cells."""
    layout = observation.rsplit("Here is the current board layout:\n", 1)[1].split("\n\n", 1)[0]
    return [row.split(" ") for row in layout.splitlines()]


def solve_sokoban(grid: list[list[str]]) -> list[str]:
    """Fewest moves that put every box on a target (BFS over player and box positions)."""
    cells = {(r, c): ch for r, row in enumerate(grid) for c, ch in enumerate(row)}
    walls = {p for p, ch in cells.items() if ch == "#"}
    targets = {p for p, ch in cells.items() if ch in "O√"}
    start = (next(p for p, ch in cells.items() if ch == "P"), frozenset(p for p, ch in cells.items() if ch in "X√"))
    seen, queue = {start}, deque([(start, [])])
    while queue:
        (player, boxes), path = queue.popleft()
        if boxes <= targets:
            return path
        for name, (dr, dc) in MOVES.items():
            nxt = (player[0] + dr, player[1] + dc)
            moved = boxes
            if nxt in walls:
                continue
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in boxes:
                    continue
                moved = boxes - {nxt} | {beyond}
            state = (nxt, moved)
            if state not in seen:
                seen.add(state)
                queue.append((state, [*path, name]))
    raise AssertionError("unsolvable board")


def test_registered_under_gem_with_the_env_return_reward() -> None:
    assert lookup_env("gem").cls is GemEnv
    assert lookup_reward("env_return").fn is env_return


@pytest.mark.parametrize("env_id", [SOKOBAN, GUESS, HANOI, RG])
def test_same_seed_and_actions_replay_the_same_episode(env_id: str) -> None:
    """An episode depends on (seed, actions) only, even with another session drawing in between."""
    actions = ["\\boxed{up}", "\\boxed{5}", "\\boxed{A C}", "\\boxed{3}", "\\boxed{left}"]

    def play(interleave: GemEnv | None) -> list[tuple[str, float, bool, dict]]:
        env = GemEnv(id=env_id)
        trace = [(env.reset(11), 0.0, False, {})]
        for i, action in enumerate(actions):
            if interleave is not None:
                interleave.reset(100 + i)  # reseeds and draws from the process-wide generators
            out = env.step(action)
            trace.append((out.observation, out.reward, out.done, out.info))
            if out.done:
                break
        return trace

    state = random.getstate()
    assert play(None) == play(GemEnv(id=env_id))
    assert random.getstate() == state  # GEM's seeding leaves the process's own generator alone


@pytest.mark.parametrize("env_id", [SOKOBAN, RG])
def test_different_seeds_give_different_puzzles(env_id: str) -> None:
    env = GemEnv(id=env_id)
    assert len({env.reset(seed) for seed in range(8)}) >= 6
    assert env.reset(3) == GemEnv(id=env_id).reset(3)
    assert env.reset(2**40 + 3) == env.reset(3)  # seeds are taken mod 2**32, numpy's range


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sokoban_solved_by_bfs_succeeds(seed: int) -> None:
    env = sokoban(observation="last", instructions=False)
    prompt = env.reset(seed)
    assert prompt.startswith("Here is the current board layout:\n") and "You are solving" not in prompt
    plan = solve_sokoban(board(prompt))
    assert 1 <= len(plan) <= 20
    for i, move in enumerate(plan):
        out = env.step(f"  {move}\n")  # the model's text is stripped before it is formatted
        assert out.info["valid"] and json.loads(json.dumps(out.info)) == out.info
        if i < len(plan) - 1:
            assert (out.reward, out.done, out.info["success"]) == (0.0, False, False)
            assert board(out.observation) != board(prompt) or "cannot move" in out.observation
    assert (out.reward, out.done) == (1.0, True)
    assert out.info == {"success": True, "valid": True, "terminated": True, "truncated": False, "gem": {}}
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("up")


def test_sokoban_invalid_and_illegal_actions_are_data() -> None:
    env = sokoban()
    env.reset(0)
    out = env.step("hello")  # no move GEM can parse: its format-error reward, and GEM ends the game
    assert (out.reward, out.done) == (-0.1, True)
    assert out.info["valid"] is False and out.info["success"] is False and out.info["terminated"] is True
    assert "your submitted action is not valid" in out.observation

    raw = GemEnv(id=SOKOBAN)  # the default action_format passes the text as it is: a bare move is unparsable
    raw.reset(0)
    assert raw.step("up").info["valid"] is False

    env.reset(0)
    grid = board(env.reset(0))
    wall = next(m for m, (dr, dc) in MOVES.items() if _at(grid, "P", dr, dc) == "#")
    out = env.step(wall)  # well-formed but illegal: GEM scores it 0 and plays on
    assert (out.reward, out.done, out.info["valid"]) == (0.0, False, True)
    assert "collide" in out.observation


def test_action_words_read_a_move_from_the_first_key_character() -> None:
    words = {"L": "left", "d": "down", "r": "right", "u": "up"}
    env = sokoban(observation="last", instructions=False, action_words=words)
    grid = board(env.reset(0))
    plan = solve_sokoban(grid)
    letters = {"up": "xU", "down": "D!", "left": " l", "right": "zzR"}  # the first key character, any case
    for move in plan:
        out = env.step(letters[move])
        assert out.info["valid"]
    assert (out.reward, out.done, out.info["success"]) == (1.0, True, True)
    env.reset(0)
    out = env.step("xyz")  # no key character: the text goes to GEM as it is, an unparsable move
    assert out.info["valid"] is False and out.done


def _at(grid: list[list[str]], letter: str, dr: int, dc: int) -> str:
    r, c = next((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == letter)
    return grid[r + dr][c + dc]


def test_observation_modes() -> None:
    concat, last = sokoban(), sokoban(observation="last", prompt_suffix="\nmove:")
    first = concat.reset(0)
    assert first.startswith("You are solving the Sokoban puzzle.") and first.endswith("Enter your move.")
    assert last.reset(0) == first + "\nmove:"
    for env in (concat, last):
        env.step("up")
        out = env.step("left")
    history = concat.step("down").observation
    assert "\\boxed{up}\nAt turn 1," in history and "\\boxed{left}\nAt turn 2," in history  # GEM's concat_with_action
    assert "At turn 3," in history and history.count("Here is the current board layout") == 1
    assert "At turn 1," not in out.observation and "At turn 2," in out.observation  # `last`: the latest feedback only
    assert out.observation.startswith("You are solving") and out.observation.endswith("Enter your move.\nmove:")


def test_guess_the_number_by_bisection_succeeds() -> None:
    env = GemEnv(id=GUESS, observation="last")
    prompt = env.reset(4)
    assert "between 1 and 10" in prompt
    low, high = 1, 10
    for _ in range(4):
        guess = (low + high) // 2
        out = env.step(f"my guess: \\boxed{{{guess}}}")
        if out.info["success"]:
            break
        hint = re.search(r"target number is (higher|lower)", out.observation)
        assert hint is not None and not out.done, out.observation
        low, high = (guess + 1, high) if hint.group(1) == "higher" else (low, guess - 1)
    assert (out.reward, out.done, out.info["success"], out.info["valid"]) == (1.0, True, True, True)


def test_tower_of_hanoi_moves_a_disk() -> None:
    env = GemEnv(id=HANOI, action_format=BOXED, observation="last", instructions=False)
    assert "A: [3, 2, 1]\nB: []\nC: []" in env.reset(0)
    out = env.step("A C")
    assert "A: [3, 2]\nB: []\nC: [1]" in out.observation and out.info["valid"] and not out.done


def test_reasoning_gym_task_scores_the_boxed_answer() -> None:
    env = GemEnv(id=RG)
    prompt = env.reset(3)
    assert prompt.startswith("Calculate ")
    answer = env._env.data["answer"]  # GEM's problem record: the test reads the answer it will be scored on
    out = env.step(f"The sum is \\boxed{{{answer}}}")
    assert (out.reward, out.done, out.info["success"], out.info["valid"]) == (1.0, True, True, True)
    assert out.info["terminated"] and out.info["truncated"]  # GEM's single-turn envs set both
    assert out.observation == prompt + f"The sum is \\boxed{{{answer}}}\n"  # GEM's end marker shown as nothing

    env.reset(3)
    wrong = env.step(f"\\boxed{{{int(answer) + 1}}}")
    assert (wrong.reward, wrong.info["success"], wrong.info["valid"]) == (0.0, False, True)
    env.reset(3)
    bare = env.step(answer)  # GEM reads only a boxed answer
    assert (bare.reward, bare.info["success"], bare.info["valid"]) == (0.0, False, False)


def test_math_on_an_offline_dataset(tmp_path: Path) -> None:
    rows = [
        {"problem": "What is 2+3?", "answer": "5"},
        {"problem": "What is 7*6?", "answer": "42"},
        {"problem": "What is 10-4?", "answer": "6"},
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # use_mp: false grades in this thread (GEM's signal timeout needs the main thread, which a unit test runs on)
    env = GemEnv(id="math:GSM8K", dataset=str(data), kwargs={"use_mp": False})
    prompts = {seed: env.reset(seed) for seed in range(6)}
    assert prompts[2] == env.reset(2) and len(set(prompts.values())) >= 2
    answers = {r["problem"] + "\n": r["answer"] for r in rows}
    prompt = env.reset(1)
    out = env.step(f"\\boxed{{{answers[prompt]}}}")
    assert (out.reward, out.done, out.info["success"]) == (1.0, True, True)
    assert json.loads(json.dumps(out.info)) == out.info
    env.reset(1)
    assert env.step("\\boxed{1000}").info["success"] is False
    env.close()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"id": "game:Sokoban-v0-eazy"}, "did you mean 'game:Sokoban-v0-easy'"),
        ({"id": "nope"}, "gem.print_envs()"),
        ({"id": "math:GSM8K"}, "give dataset: a local"),
        ({"id": RG, "dataset": "rows.jsonl"}, "dataset applies only"),
        ({"id": "math:GSM8K", "dataset": "/nonexistent.jsonl"}, "cannot be read"),
        ({"id": SOKOBAN, "observation": "all"}, "observation must be one of"),
        ({"id": SOKOBAN, "action_format": "{{action}}"}, "action_format must be"),
        ({"id": SOKOBAN, "action_format": "{move}"}, "action_format must be"),
        ({"id": SOKOBAN, "kwargs": ["max_turns"]}, "kwargs must be a mapping"),
        ({"id": SOKOBAN, "instructions": "no"}, "instructions must be"),
        ({"id": SOKOBAN, "action_words": {"up": "up"}}, "action_words must map single characters"),
        ({"id": SOKOBAN, "obervation": "last"}, "unknown env_args ['obervation']"),
    ],
)
def test_bad_args_raise_value_error_naming_the_arg(args: dict, named: str) -> None:
    with pytest.raises(ValueError) as err:
        GemEnv(**args)
    assert named in str(err.value)


def test_gem_kwargs_reach_gem_make() -> None:
    env = GemEnv(id=SOKOBAN, kwargs={"max_turns": 2}, action_format=BOXED)
    assert "within 2 turns" in env.reset(0)
    env.step("left")
    out = env.step("left")
    assert out.done and out.info["truncated"]


def test_env_return_sums_env_rewards_with_the_last_turns_success() -> None:
    turns = [
        TurnRecord(observation="o", action="a", env_reward=0.0, info={"success": False}),
        TurnRecord(observation="o", action="b", env_reward=1.0, done=True, info={"success": True}),
    ]
    solved = env_return(Transcript(task="t", seed=0, turns=turns))
    assert (solved.value, solved.success) == (1.0, True)
    failed = env_return(Transcript(task="t", seed=0, turns=[TurnRecord(observation="o", action="x", env_reward=-0.1)]))
    assert (failed.value, failed.success) == (-0.1, False)
    assert env_return(Transcript(task="t", seed=0, turns=[])).success is False


@pytest.mark.integration
def test_rollout_cli_runs_the_sokoban_example(
    capsys: pytest.CaptureFixture[str], stack: LocalStack, stack_job: JobSpec, tmp_path: Path
) -> None:
    """examples/sokoban.yaml through `rollart rollout` on the session's stack (its tiny model and engine)."""
    job = load_job(REPO / "examples" / "sokoban.yaml")
    job = job.model_copy(
        update={"model_dir": stack_job.model_dir, "store": stack_job.store, "engine": stack_job.engine}
    )
    job_file = tmp_path / "job.json"
    job_file.write_text(job.model_dump_json())
    done = rollart(
        capsys, "rollout", str(job_file), "-n", "8", "--temporal-address", stack.address, "--ui-url", "http://ui"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8/8 completed" in done.stdout
