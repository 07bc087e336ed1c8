"""GEM as a rollart env: any gem-llm env id — its text games, reasoning-gym tasks (``rg:*``), math on local rows.

``env: gem`` with ``env_args: {id: "game:Sokoban-v0-easy"}`` plays that GEM env (gem-llm 0.1.0). Ids
look like ``game:Sokoban-v0-easy``, ``game:GuessTheNumber-v0-easy``, ``rg:basic_arithmetic``,
``math:GSM8K``; list them with ``python -c "import gem; gem.print_envs()"``. Offline, every
``game:*`` env that needs no word list and every ``rg:*`` task runs; ids backed by a hub dataset
(``math:*``, ``qa:*``, ``code:*``, ``eval:*``, ``logic:*``) need ``dataset``: a local file of rows.

Observation (the whole prompt of the next turn). GEM's ``reset`` returns the task text (a game's
rules, a question) and, for games, ``info["suffix"]``: the current state ("Here is the current
board layout: ... Enter your move."). Each ``step`` returns a line of feedback ("At turn 1, you
moved up.") and a fresh suffix. The prompt is assembled as GEM's own ``concat_with_action``
wrapper does (each part on its own line):

- ``observation: concat`` (default): the task text, then every (GEM action, feedback) so far, then
  the current suffix — the full history, which games like GuessTheNumber and Mastermind need
  (their hints live only in the feedback);
- ``observation: last``: the task text, the latest feedback only, then the suffix — short, and
  complete for games whose suffix shows the whole state (Sokoban, 2048, TowerofHanoi, Sudoku, ...).

``instructions: false`` drops the task text whenever GEM gives a suffix (a game's rules, long for a
small tokenizer); envs without one (``rg:*``, math) always show it, as it is the question. GEM's
``info["prefix"]`` (none of the offline envs has one) goes first; ``prompt_suffix`` is appended
last (e.g. ``"\\nmove:"``). GEM's end-of-episode marker ``<｜TERMINAL_STATE｜>`` is shown as empty
feedback.

Action. The model's text, stripped of surrounding whitespace, is put into ``action_format`` (a
``str.format`` template with one field, ``{action}``) and that is what GEM's ``step`` gets.
Every GEM env reads its answer from the *last* ``\\boxed{...}`` in the text, so
``action_format: "{action}"`` (default) suits a model that writes ``\\boxed{up}`` itself, and
``"\\\\boxed{{{action}}}"`` (in YAML double quotes; the template ``\\boxed{{{action}}}``) wraps a
bare ``up`` for a model that does not. ``action_words`` (e.g. ``{l: left, d: down, r: right, u: up}``)
first reads a move the way FrozenLake does: the first character of the text that is one of its keys
(any case) picks that word, so a tiny model's one-token answers are moves; text with none of them
goes to GEM as it is (and is GEM's invalid action).

Reward, done and info. The reward is GEM's step reward (Sokoban: 1 when solved, -0.1 for an
unparsable action, the share of boxes on targets when turns run out, else 0; ``rg:*``:
reasoning-gym's score of the boxed answer; math: 1 when correct). ``done`` is GEM's
``terminated or truncated`` (GEM ends a game on an unparsable action). ``info`` holds:

- ``success``: the step ended the episode with GEM's full success reward (1.0) — GEM has no
  success flag of its own, and its soft end-of-game rewards (Sokoban's share of boxes) stay below 1;
- ``valid``: the action was well-formed for GEM — it holds a ``\\boxed{...}`` answer and GEM did not
  answer it with its format-error reward (-0.1); a legal-format but illegal move (walking into a
  wall) is valid, as GEM scores it so (0);
- ``terminated``, ``truncated``: GEM's flags (single-turn ``rg:*`` and math envs set both);
- ``gem``: GEM's own info, the JSON-safe part, without the prefix/suffix already in the prompt.

Determinism. GEM envs draw from the process-wide ``random`` and ``numpy.random`` (``reset(seed)``
seeds both). Sessions share a worker process and its threads, so every GEM call here runs under
one lock with the session's own generator state swapped in and the process's swapped back after:
an episode depends only on (seed, actions), as a replayed session must. (So GEM calls in one worker
process take turns: milliseconds for games, up to GEM's 1 s grading timeout for math.) ``reset`` builds a fresh
GEM env each time (milliseconds), because some keep state across resets (``rg:*`` re-draws its
problem set every 500 resets). Seeds are taken modulo 2**32 (numpy's range).

Math. GEM's math env grades in a one-process pool (``use_mp``, its default) because its timeout
uses ``signal.alarm``, which works only on a process's main thread; env calls run on worker
threads, so keep that default in jobs (``kwargs: {use_mp: false}`` only where steps run on the
main thread, as in tests).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import random
import threading
from pathlib import Path
from typing import Any, Final

from rollart.spec.env import Env, StepOutcome
from rollart.spec.registry import env

__all__ = ["OBSERVATION_MODES", "GemEnv", "compose_prompt"]

OBSERVATION_MODES: Final = ("concat", "last")

_TERMINAL_STATE: Final = "<｜TERMINAL_STATE｜>"  # GEM's gem.utils.constants.TERMINAL_STATE
_SUCCESS_REWARD: Final = 1.0  # GEM's LanguageGameReward.success_reward
_FORMAT_ERROR_REWARD: Final = -0.1  # GEM's LanguageGameReward.format_error_reward
_SEED_RANGE: Final = 2**32
_PROMPT_KEYS: Final = ("prefix", "suffix")
_HUB_DATASET_KEY: Final = "dataset_name"  # in a GEM spec's kwargs: the env loads a hub dataset unless given one
_INSTALL_HINT: Final = (
    "`make setup` installs it; by hand: pip install --no-deps gem-llm==0.1.0 and its light requirements "
    "(see pyproject.toml: nltk, math-verify, pylatexenc)"
)

_GEM_LOCK = threading.Lock()
"""Serialises GEM calls in this process: GEM seeds and draws from the process-wide generators."""


def compose_prompt(
    first: str,
    turns: list[tuple[str, str]],
    info: dict[str, Any],
    *,
    observation: str = "concat",
    instructions: bool = True,
    prompt_suffix: str = "",
) -> str:
    """The next prompt from GEM's reset text, the (action, feedback) turns so far and GEM's latest info.

    As GEM's ``concat_with_action`` wrapper: each part on its own line, ``info["prefix"]`` first,
    ``info["suffix"]`` last; then `prompt_suffix`. See the module docstring for the modes.
    """
    suffix = info.get("suffix")
    parts = [first] if instructions or not suffix else []
    shown = turns if observation == "concat" else turns[-1:]
    for action, feedback in shown:
        if observation == "concat":
            parts.append(action)
        parts.append("" if feedback == _TERMINAL_STATE else feedback)
    text = "".join(_line(p) for p in parts)
    prefix = info.get("prefix")
    if isinstance(prefix, str):
        text = prefix + text
    if isinstance(suffix, str):
        text += suffix
    return text + prompt_suffix


@env("gem")
class GemEnv(Env):
    """Any GEM (gem-llm) env by id; reward, done and a JSON-safe info mapped from GEM's step.

    env_args: ``id`` (a GEM env id, required), ``kwargs`` (a dict passed to ``gem.make`` over the
    id's registered ones, e.g. ``{max_turns: 10}``), ``action_format`` (default ``"{action}"``),
    ``action_words`` (letter → GEM action, default none), ``observation`` ("concat" | "last", default "concat"),
    ``instructions`` (bool, default true),
    ``prompt_suffix`` (str, default ""), ``dataset`` (path to a .jsonl or .json file of rows, for
    ids backed by a hub dataset; required there, refused elsewhere). The module docstring
    documents the mapping.
    """

    def __init__(
        self,
        *,
        id: str,  # the env_args key: GEM's own name for it (shadows the builtin here only)
        kwargs: dict[str, Any] | None = None,
        action_format: str = "{action}",
        action_words: dict[str, str] | None = None,
        observation: str = "concat",
        instructions: bool = True,
        prompt_suffix: str = "",
        dataset: str | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__(**unknown)
        _validate_args(kwargs, action_format, observation, instructions, prompt_suffix)
        self._gem = _import_gem()
        self.id = id
        spec = _spec(id)
        self.kwargs = dict(kwargs or {})
        self._rows = _load_rows(id, spec, dataset)
        self._dataset_obj: Any = None
        self.action_format = action_format
        self.action_words = _action_words(action_words)
        self.observation = observation
        self.instructions = instructions
        self.prompt_suffix = prompt_suffix
        self._env: Any = None
        self._rng: tuple[Any, Any] | None = None
        self._first = ""
        self._turns: list[tuple[str, str]] = []
        self._info: dict[str, Any] = {}
        self._done = False

    def reset(self, seed: int) -> str:
        """A fresh GEM env reset with `seed` (mod 2**32); its task text and state as the prompt."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"GemEnv.reset: seed must be an int, got {seed!r}")
        self.close()
        gem_seed = seed % _SEED_RANGE
        extra = {"dataset": self._dataset()} if self._rows is not None else {}

        def start() -> tuple[Any, Any]:
            self._env = self._gem.make(self.id, **self.kwargs, **extra)
            return self._env.reset(seed=gem_seed)

        first, info = self._call(start, seed=gem_seed)
        self._first = _text(first, "reset observation")
        self._info = info if isinstance(info, dict) else {}
        self._turns = []
        self._done = False
        return self._prompt()

    def step(self, action: str) -> StepOutcome:
        """Pass the formatted action to GEM's step; map its (obs, reward, terminated, truncated, info)."""
        if self._env is None:
            raise RuntimeError("GemEnv has no episode yet: call reset(seed) before step")
        if self._done:
            raise RuntimeError("GemEnv.step called after the episode ended; call reset(seed) to start a new one")
        gem_action = self.action_format.format(action=self._word(action.strip()))
        feedback, reward, terminated, truncated, info = self._call(lambda: self._env.step(gem_action))
        reward = float(reward)
        if not math.isfinite(reward):
            raise RuntimeError(f"GEM env {self.id!r} returned a non-finite reward {reward!r}")
        self._info = info if isinstance(info, dict) else {}
        self._turns.append((str(self._info.get("parsed_action", gem_action)), _text(feedback, "step observation")))
        self._done = bool(terminated) or bool(truncated)
        return StepOutcome(
            observation=self._prompt(),
            reward=reward,
            done=self._done,
            info={
                "success": self._done and reward >= _SUCCESS_REWARD,
                "valid": _boxed(gem_action) and reward != _FORMAT_ERROR_REWARD,
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "gem": _json_safe({k: v for k, v in self._info.items() if k not in _PROMPT_KEYS}),
            },
        )

    def close(self) -> None:
        """Close the GEM env if it holds anything (math's grading pool)."""
        gem_env, self._env = self._env, None
        close = getattr(gem_env, "close", None)
        if callable(close) and getattr(gem_env, "use_mp", True):  # GEM's math close() assumes its pool (use_mp)
            close()

    def _word(self, text: str) -> str:
        """The GEM action `action_words` reads from `text` (its first key character), else `text` itself."""
        for char in text.lower():
            if char in self.action_words:
                return self.action_words[char]
        return text

    def _prompt(self) -> str:
        return compose_prompt(
            self._first,
            self._turns,
            self._info,
            observation=self.observation,
            instructions=self.instructions,
            prompt_suffix=self.prompt_suffix,
        )

    def _dataset(self) -> Any:
        """The rows as a `datasets.Dataset`, built on first use (GEM's env shuffles a copy; this one is kept)."""
        if self._dataset_obj is None:
            from datasets import Dataset

            self._dataset_obj = Dataset.from_list(self._rows)
        return self._dataset_obj

    def _call(self, fn: Any, seed: int | None = None) -> Any:
        """Run a GEM call under the lock with this session's generator state (seeded afresh when `seed` is given)."""
        import numpy as np

        with _GEM_LOCK:
            outer = (random.getstate(), np.random.get_state())
            try:
                if seed is not None:
                    random.seed(seed)
                    np.random.seed(seed)
                elif self._rng is not None:
                    random.setstate(self._rng[0])
                    np.random.set_state(self._rng[1])
                return fn()
            finally:
                self._rng = (random.getstate(), np.random.get_state())
                random.setstate(outer[0])
                np.random.set_state(outer[1])


def _import_gem() -> Any:
    """`import gem`, undoing the `logging.basicConfig(level=INFO)` its import runs: the worker's logging stays."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import gem
        import gem.envs  # registers GEM's env ids
    except ImportError as e:
        raise ImportError(f"gem: the GEM env needs the gem-llm package ({e}); {_INSTALL_HINT}") from e
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    return gem


def _spec(env_id: Any) -> Any:
    """GEM's registered spec for `env_id`; a ValueError naming close ids and how to list them otherwise."""
    from gem.envs.registration import ENV_REGISTRY

    if not isinstance(env_id, str) or env_id not in ENV_REGISTRY:
        close = difflib.get_close_matches(str(env_id), list(ENV_REGISTRY), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(
            f"gem: id must be a registered GEM env id such as 'game:Sokoban-v0-easy' or 'rg:basic_arithmetic', "
            f'got {env_id!r}{hint}; list them with: python -c "import gem; gem.print_envs()"'
        )
    return ENV_REGISTRY[env_id]


def _load_rows(env_id: str, spec: Any, dataset: Any) -> list[dict[str, Any]] | None:
    """The rows of `dataset` (a .jsonl or .json file) for an id backed by a hub dataset, checked for its keys."""
    hub = _HUB_DATASET_KEY in spec.kwargs
    if dataset is None:
        if hub:
            raise ValueError(
                f"gem: {env_id!r} loads the hub dataset {spec.kwargs[_HUB_DATASET_KEY]!r}, which needs a "
                "network; give dataset: a local .jsonl/.json file of rows instead"
            )
        return None
    if not hub:
        raise ValueError(f"gem: dataset applies only to ids backed by a dataset (math:*, qa:*, ...), not {env_id!r}")
    if not isinstance(dataset, str):
        raise ValueError(f"gem: dataset must be a path to a .jsonl or .json file, got {dataset!r}")
    path = Path(dataset)
    try:
        text = path.read_text(encoding="utf-8")
        rows = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if path.suffix == ".jsonl"
            else json.loads(text)
        )
    except (OSError, ValueError) as e:
        raise ValueError(f"gem: dataset {dataset!r} cannot be read as {path.suffix or 'json'}: {e}") from e
    keys = [spec.kwargs.get("question_key", "problem"), spec.kwargs.get("answer_key", "answer")]
    if (
        not isinstance(rows, list)
        or not rows
        or not all(isinstance(r, dict) and all(k in r for k in keys) for r in rows)
    ):
        raise ValueError(
            f"gem: dataset {dataset!r} must hold a non-empty list of rows, each with the keys "
            f"{keys} that {env_id!r} reads"
        )
    return rows


def _action_words(words: Any) -> dict[str, str]:
    """`action_words` keyed by lower-case single characters, or ValueError naming the argument."""
    if words is None:
        return {}
    if (
        not isinstance(words, dict)
        or not words
        or not all(isinstance(k, str) and len(k) == 1 and isinstance(v, str) and v for k, v in words.items())
    ):
        raise ValueError(
            f"gem: action_words must map single characters to GEM actions, e.g. {{l: left, r: right}}; got {words!r}"
        )
    return {k.lower(): v for k, v in words.items()}


def _validate_args(kwargs: Any, action_format: Any, observation: Any, instructions: Any, prompt_suffix: Any) -> None:
    """Reject bad env_args when the session is built, naming the argument and what it accepts."""
    if kwargs is not None and (not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs)):
        raise ValueError(f"gem: kwargs must be a mapping of gem.make keyword arguments, got {kwargs!r}")
    if kwargs and "dataset" in kwargs:
        raise ValueError("gem: give a dataset as env_args.dataset (a file path), not inside kwargs")
    try:
        ok = isinstance(action_format, str) and "\x00" in action_format.format(action="\x00")
    except (IndexError, KeyError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            "gem: action_format must be a str.format template whose only field is {action} "
            f"(e.g. '{{action}}' or '\\\\boxed{{{{{{action}}}}}}'), got {action_format!r}"
        )
    if observation not in OBSERVATION_MODES:
        raise ValueError(
            f"gem: observation must be one of {', '.join(map(repr, OBSERVATION_MODES))}, got {observation!r}"
        )
    if not isinstance(instructions, bool):
        raise ValueError(f"gem: instructions must be true or false, got {instructions!r}")
    if not isinstance(prompt_suffix, str):
        raise ValueError(f"gem: prompt_suffix must be a string, got {prompt_suffix!r}")


def _line(text: str) -> str:
    """GEM's `maybe_add_new_line`: end non-empty text with a newline."""
    return text if not text or text.endswith("\n") else text + "\n"


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise RuntimeError(f"GEM returned a {type(value).__name__} as its {what}; the gem env plays text envs only")
    return value


def _boxed(text: str) -> bool:
    """Whether `text` holds a complete ``\\boxed{...}`` answer, as GEM's own parsers look for."""
    from gem.utils.parsing import extract_last_boxed_answer

    return extract_last_boxed_answer(text) is not None


def _json_safe(value: Any) -> Any:
    """`value` with numpy scalars unwrapped and tuples as lists; parts JSON cannot carry are dropped (None)."""
    if type(value).__module__ == "numpy" and callable(getattr(value, "tolist", None)):
        value = value.tolist()  # a numpy scalar becomes a Python one, an array nested lists
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items() if isinstance(k, str)}
    return None
