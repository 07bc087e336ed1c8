"""FrozenLake as text: maps, the action rule, transitions, the prompt format and registration."""

from __future__ import annotations

import json

import pytest

from rollart.activities.envs.frozenlake import (
    STANDARD_MAP,
    FrozenLake,
    generate_map,
    parse_action,
    render,
    shortest_path_length,
)
from rollart.spec.env import Env, StepOutcome
from rollart.spec.registry import lookup_env

# Standard map: SFFF / FHFH / FFFH / HFFG. A shortest winning walk: D D R R D R.
WINNING_WALK = ["D", "D", "R", "R", "D", "R"]


def test_registered_under_frozenlake() -> None:
    assert lookup_env("frozenlake").cls is FrozenLake
    assert issubclass(FrozenLake, Env)


def test_standard_map_is_the_classic_one_for_every_seed() -> None:
    assert STANDARD_MAP == ("SFFF", "FHFH", "FFFH", "HFFG")
    lake = FrozenLake()
    for seed in (0, 1, 12345):
        assert lake.reset(seed) == "AFFF\nFHFH\nFFFH\nHFFG\nmove:"
        assert lake.grid == STANDARD_MAP
    assert shortest_path_length(STANDARD_MAP) == 6


@pytest.mark.parametrize("size", [3, 4, 5, 8])
@pytest.mark.parametrize("p_hole", [0.2, 0.5])
def test_random_maps_are_deterministic_and_solvable(size: int, p_hole: float) -> None:
    maps = [generate_map(size, seed, p_hole) for seed in range(200)]
    assert maps == [generate_map(size, seed, p_hole) for seed in range(200)]
    for grid in maps:
        assert len(grid) == size and all(len(row) == size for row in grid)
        assert grid[0][0] == "S" and grid[-1][-1] == "G"
        assert set("".join(grid)) <= set("SFHG")
        assert shortest_path_length(grid) is not None
    # A 3x3 map has only 2**7 hole layouts, so ask for variety, not uniqueness.
    assert len(set(maps)) > (100 if size >= 5 else 20), "different seeds should give different maps"
    if p_hole > 0:
        assert any("H" in "".join(grid) for grid in maps)


def test_random_env_uses_the_seed_map() -> None:
    lake = FrozenLake(size=6, maps="random", p_hole=0.3)
    for seed in range(20):
        lake.reset(seed)
        assert lake.grid == generate_map(6, seed, 0.3)


def test_num_maps_cycles_through_a_fixed_set() -> None:
    lake = FrozenLake(size=5, maps="random", num_maps=3)
    grids = []
    for seed in range(9):
        lake.reset(seed)
        grids.append(lake.grid)
    assert grids[:3] == [generate_map(5, i, 0.2) for i in range(3)]
    assert grids[3:6] == grids[:3] and grids[6:9] == grids[:3]


def test_shortest_path_length_unreachable_and_trivial() -> None:
    assert shortest_path_length(("SHF", "HFF", "FFG")) is None
    assert shortest_path_length(("SFF", "FFF", "FFG")) == 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("L", "L"),
        ("D", "D"),
        ("R", "R"),
        ("U", "U"),
        ("xxd", "D"),
        ("  R,", "R"),
        ("r", "R"),
        ("left", "L"),
        ("down", "D"),
        ("right", "R"),
        ("up", "U"),
        ("UP", "U"),
        ("hello", "L"),  # documented: first of L/D/R/U in either case, so the "l" wins
        ("move: D then R", "D"),
        ("", None),
        ("xyz 123", None),
        ("\n\t", None),
    ],
)
def test_action_rule(text: str, expected: str | None) -> None:
    assert parse_action(text) == expected


def test_render_marks_the_agent() -> None:
    assert render(STANDARD_MAP, (0, 0)) == "AFFF\nFHFH\nFFFH\nHFFG\nmove:"
    assert render(STANDARD_MAP, (2, 1)) == "SFFF\nFHFH\nFAFH\nHFFG\nmove:"


def test_walls_keep_the_agent_in_place_but_are_valid() -> None:
    lake = FrozenLake()
    start = lake.reset(0)
    for move in ("L", "U"):
        out = lake.step(move)
        assert out.observation == start
        assert out.info["valid"] is True and out.info["action"] == move
        assert out.info["position"] == [0, 0]
        assert out.reward == 0.0 and out.done is False


def test_invalid_action_is_a_no_op() -> None:
    lake = FrozenLake()
    lake.reset(0)
    lake.step("R")
    out = lake.step("???")
    assert out == StepOutcome(
        observation="SAFF\nFHFH\nFFFH\nHFFG\nmove:",
        reward=0.0,
        done=False,
        info={
            "valid": False,
            "success": False,
            "hole": False,
            "position": [0, 1],
            "action": None,
            "distance": 5,
            "start_distance": 6,
        },
    )


def test_hole_ends_the_episode_with_zero_reward() -> None:
    lake = FrozenLake()
    lake.reset(0)
    lake.step("R")
    out = lake.step("D")  # (1, 1) is a hole
    assert out.done is True and out.reward == 0.0
    assert out.info["hole"] is True and out.info["success"] is False
    assert out.info["position"] == [1, 1]
    assert out.observation == "SFFF\nFAFH\nFFFH\nHFFG\nmove:"


def test_reaching_the_goal_gives_reward_one_and_success() -> None:
    lake = FrozenLake()
    lake.reset(0)
    outs = [lake.step(move) for move in WINNING_WALK]
    assert all(not o.done and o.reward == 0.0 for o in outs[:-1])
    last = outs[-1]
    assert last.done is True and last.reward == 1.0
    assert last.info == {
        "valid": True,
        "success": True,
        "hole": False,
        "position": [3, 3],
        "action": "R",
        "distance": 0,
        "start_distance": 6,
    }
    assert last.observation == "SFFF\nFHFH\nFFFH\nHFFA\nmove:"
    json.dumps(last.info)  # info crosses process boundaries as JSON


def test_step_after_done_raises_and_reset_starts_again() -> None:
    lake = FrozenLake()
    lake.reset(0)
    for move in WINNING_WALK:
        lake.step(move)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        lake.step("L")
    assert lake.reset(1) == "AFFF\nFHFH\nFFFH\nHFFG\nmove:"
    assert lake.step("R").info["position"] == [0, 1]


def test_step_before_reset_raises() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        FrozenLake().step("R")


def test_random_map_is_winnable_by_following_bfs() -> None:
    lake = FrozenLake(size=8, maps="random", p_hole=0.4)
    for seed in range(10):
        lake.reset(seed)
        steps = shortest_path_length(lake.grid)
        assert steps is not None and steps >= 14  # Manhattan distance corner to corner


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"size": 2, "maps": "random"}, "size"),
        ({"size": 9, "maps": "random"}, "size"),
        ({"size": 4.0}, "size"),
        ({"size": 5}, "size"),  # standard map is 4x4 only
        ({"maps": "classic"}, "maps"),
        ({"maps": "random", "p_hole": 0.9}, "p_hole"),
        ({"maps": "random", "p_hole": -0.1}, "p_hole"),
        ({"maps": "random", "num_maps": 0}, "num_maps"),
        ({"maps": "random", "num_maps": "3"}, "num_maps"),
        ({"num_maps": 3}, "num_maps"),  # only with maps="random"
        ({"slippery": True}, "slippery"),
    ],
)
def test_bad_env_args_raise_value_error_naming_the_arg(args: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        FrozenLake(**args)


def test_invalid_action_can_end_the_episode() -> None:
    env = FrozenLake(invalid_action="end")
    env.reset(0)
    out = env.step("xyz")
    assert out.done and out.reward == 0.0 and out.info["valid"] is False and not out.info["success"]
    keep = FrozenLake()
    keep.reset(0)
    assert not keep.step("xyz").done
    with pytest.raises(ValueError, match="invalid_action"):
        FrozenLake(invalid_action="stop")
