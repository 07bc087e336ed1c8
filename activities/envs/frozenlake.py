"""FrozenLake as text: a deterministic (not slippery) grid walk, the built-in env a tiny policy can learn.

Grid letters: ``S`` start (top-left), ``F`` frozen (safe), ``H`` hole (ends
the episode, reward 0), ``G`` goal (bottom-right; ends it with reward 1).

Observation (the whole prompt of the next turn, see `render`): the grid rows
with ``A`` replacing the letter at the agent's cell, joined by newlines,
then ``"\\nmove:"``; e.g. at the start of the standard map::

    AFFF
    FHFH
    FFFH
    HFFG
    move:

Action rule (see `parse_action`): the first character of the generated text
that is one of ``L D R U`` or ``l d r u`` is the move (Left, Down, Right,
Up). So ``"xxd"`` is Down, ``"  R,"`` is Right, and the words ``left``,
``down``, ``right``, ``up`` work because each starts with its letter; but
``"hello"`` is Left (its first such character is ``l``). Text with none of
those characters is an invalid action: the agent stays put, reward 0,
``info["valid"] = False``, and with ``invalid_action="end"`` the episode ends
there (a no-op by default). Moving into the edge of the grid is a valid
action that leaves the agent in place.

Maps (env_args): ``maps="standard"`` is the classic 4x4 map whatever the
seed; ``maps="random"`` generates a solvable ``size`` x ``size`` map from the
seed, or, with ``num_maps=N``, picks map ``seed % N`` from a fixed set of N
maps so that a small set can be learned.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from typing import Any, Final, Literal

from rollart.spec.env import Env, StepOutcome
from rollart.spec.registry import env

__all__ = [
    "ACTIONS",
    "STANDARD_MAP",
    "Action",
    "FrozenLake",
    "generate_map",
    "parse_action",
    "render",
    "shortest_path_length",
]

Action = Literal["L", "D", "R", "U"]

ACTIONS: Final[dict[str, tuple[int, int]]] = {"L": (0, -1), "D": (1, 0), "R": (0, 1), "U": (-1, 0)}
"""Each move's (row, col) offset."""

STANDARD_MAP: Final[tuple[str, ...]] = ("SFFF", "FHFH", "FFFH", "HFFG")
"""The classic fixed 4x4 map (gymnasium's "4x4")."""

_MIN_SIZE, _MAX_SIZE = 3, 8
_MAX_P_HOLE = 0.5
# Above ~0.5 holes, corner-to-corner paths get so rare that "regenerate until
# solvable" could spin for a long time; this cap keeps generation instant.
_MAX_ATTEMPTS = 100_000
_MAP_KINDS = ("standard", "random")


def render(grid: Sequence[str], position: tuple[int, int]) -> str:
    """The observation for the agent at `position`: rows with ``A`` at the agent, then ``move:``.

    Kept short and regular because a tiny model reads it; change the prompt
    format here and nowhere else.
    """
    row, col = position
    rows = list(grid)
    rows[row] = rows[row][:col] + "A" + rows[row][col + 1 :]
    return "\n".join(rows) + "\nmove:"


def parse_action(text: str) -> Action | None:
    """The move in the model's text: its first character among L/D/R/U (either case), else None (invalid)."""
    for ch in text:
        if ch in "LDRUldru":
            return ch.upper()  # type: ignore[return-value]
    return None


def shortest_path_length(grid: Sequence[str], start: tuple[int, int] | None = None) -> int | None:
    """Fewest moves from ``start`` (default ``S``) to ``G`` avoiding holes (BFS), or None if unreachable."""
    start = start if start is not None else _find(grid, "S")
    if grid[start[0]][start[1]] == "H":
        return None
    goal = _find(grid, "G")
    distance = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return distance[cell]
        for d_row, d_col in ACTIONS.values():
            nxt = (cell[0] + d_row, cell[1] + d_col)
            if _inside(grid, nxt) and nxt not in distance and grid[nxt[0]][nxt[1]] != "H":
                distance[nxt] = distance[cell] + 1
                queue.append(nxt)
    return None


def generate_map(size: int, seed: int, p_hole: float = 0.2) -> tuple[str, ...]:
    """A solvable `size` x `size` map, the same for the same arguments.

    S is top-left and G bottom-right; every other cell is a hole with
    probability `p_hole`. Unsolvable draws are redrawn from the same seeded
    generator, so the result depends only on the arguments.
    """
    rng = random.Random(seed)
    for _ in range(_MAX_ATTEMPTS):
        cells = [["H" if rng.random() < p_hole else "F" for _ in range(size)] for _ in range(size)]
        cells[0][0] = "S"
        cells[size - 1][size - 1] = "G"
        grid = tuple("".join(row) for row in cells)
        if shortest_path_length(grid) is not None:
            return grid
    raise RuntimeError(f"no solvable {size}x{size} map with p_hole={p_hole} in {_MAX_ATTEMPTS} draws (seed {seed})")


@env("frozenlake")
class FrozenLake(Env):
    """Deterministic text FrozenLake; reward 1.0 on reaching G, else 0.0.

    env_args: ``size`` (3..8, default 4), ``maps`` ("standard" | "random",
    default "standard"; "standard" needs size 4), ``p_hole`` (0..0.5, default
    0.2, used by "random"), ``num_maps`` (positive int or None, only with
    "random": map index = seed % num_maps), ``invalid_action`` ("noop" |
    "end", default "noop": what text with no move does).
    """

    def __init__(
        self,
        *,
        size: int = 4,
        maps: str = "standard",
        p_hole: float = 0.2,
        num_maps: int | None = None,
        invalid_action: str = "noop",
        **unknown: Any,
    ) -> None:
        super().__init__(**unknown)
        _validate_args(size, maps, p_hole, num_maps)
        if invalid_action not in _INVALID_RULES:
            raise ValueError(
                f"frozenlake: invalid_action must be one of {', '.join(map(repr, _INVALID_RULES))}, "
                f"got {invalid_action!r}"
            )
        self.invalid_action = invalid_action
        self.size = size
        self.maps = maps
        self.p_hole = float(p_hole)
        self.num_maps = num_maps
        self._grid: tuple[str, ...] | None = None
        self._start_distance: int | None = None
        self._position = (0, 0)
        self._done = False

    @property
    def grid(self) -> tuple[str, ...]:
        """The current episode's map; reset first."""
        if self._grid is None:
            raise RuntimeError("FrozenLake has no map yet: call reset(seed) before using it")
        return self._grid

    def map_for_seed(self, seed: int) -> tuple[str, ...]:
        """The map an episode started with `seed` is played on."""
        if self.maps == "standard":
            return STANDARD_MAP
        map_seed = seed % self.num_maps if self.num_maps is not None else seed
        return generate_map(self.size, map_seed, self.p_hole)

    def reset(self, seed: int) -> str:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"FrozenLake.reset: seed must be an int, got {seed!r}")
        self._grid = self.map_for_seed(seed)
        self._position = _find(self._grid, "S")
        self._done = False
        self._start_distance = shortest_path_length(self._grid)
        return render(self._grid, self._position)

    def action_of(self, text: str) -> str | None:
        """The move `step` would make for `text` (`parse_action`): L, D, R, U, or None."""
        return parse_action(text)

    def step(self, action: str) -> StepOutcome:
        grid = self.grid
        if self._done:
            raise RuntimeError("FrozenLake.step called after the episode ended; call reset(seed) to start a new one")
        move = parse_action(action)
        if move is not None:
            d_row, d_col = ACTIONS[move]
            target = (self._position[0] + d_row, self._position[1] + d_col)
            if _inside(grid, target):
                self._position = target
        cell = grid[self._position[0]][self._position[1]]
        success, hole = cell == "G", cell == "H"
        self._done = success or hole or (move is None and self.invalid_action == "end")
        return StepOutcome(
            observation=render(grid, self._position),
            reward=1.0 if success else 0.0,
            done=self._done,
            info={
                "valid": move is not None,
                "success": success,
                "hole": hole,
                "position": [self._position[0], self._position[1]],
                "action": move,
                "distance": shortest_path_length(grid, self._position),  # moves left to G; None in a hole
                "start_distance": self._start_distance,
            },
        )


_INVALID_RULES = ("noop", "end")


def _validate_args(size: Any, maps: Any, p_hole: Any, num_maps: Any) -> None:
    """Reject bad env_args when the session is built, naming the argument and what it accepts."""
    if isinstance(size, bool) or not isinstance(size, int) or not _MIN_SIZE <= size <= _MAX_SIZE:
        raise ValueError(f"frozenlake: size must be an int in {_MIN_SIZE}..{_MAX_SIZE}, got {size!r}")
    if maps not in _MAP_KINDS:
        raise ValueError(f"frozenlake: maps must be one of {', '.join(map(repr, _MAP_KINDS))}, got {maps!r}")
    if isinstance(p_hole, bool) or not isinstance(p_hole, (int, float)) or not 0.0 <= p_hole <= _MAX_P_HOLE:
        raise ValueError(f"frozenlake: p_hole must be a number in 0..{_MAX_P_HOLE}, got {p_hole!r}")
    if num_maps is not None and (isinstance(num_maps, bool) or not isinstance(num_maps, int) or num_maps < 1):
        raise ValueError(f"frozenlake: num_maps must be a positive int or None, got {num_maps!r}")
    if maps == "standard":
        if size != 4:
            raise ValueError(f"frozenlake: size must be 4 with maps='standard' (the classic map), got {size!r}")
        if num_maps is not None:
            raise ValueError("frozenlake: num_maps applies only to maps='random'; drop it or set maps='random'")


def _find(grid: Sequence[str], letter: str) -> tuple[int, int]:
    for row, line in enumerate(grid):
        col = line.find(letter)
        if col >= 0:
            return (row, col)
    raise ValueError(f"map has no {letter!r} cell: {list(grid)}")


def _inside(grid: Sequence[str], cell: tuple[int, int]) -> bool:
    return 0 <= cell[0] < len(grid) and 0 <= cell[1] < len(grid[0])
