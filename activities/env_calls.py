"""Blocking calls into env code, run on an env worker's own threads (`EnvActivities._call`).

Each turns what a user's env does wrong into the error a retry policy understands: a raising `reset` is
retryable, a wrong answer type or rejected `env_args` is bad input, a raising `step` is a broken env, and a
remote session that went away is `EnvSessionLost`. Chat envs (`ChatEnv`) and text envs share every call.
"""

from __future__ import annotations

import logging
from typing import Any

from rollart.activities.envs.faults import FaultyEnv
from rollart.activities.errors import bad_input, env_broken, unknown_component
from rollart.contracts.activities import StepResult
from rollart.contracts.errors import ErrorType
from rollart.infra.secrets import scrub
from rollart.spec.chat import ChatMessage, as_messages
from rollart.spec.env import ChatEnv, EnvSessionLost, observation_text
from rollart.spec.registry import EnvEntry, UnknownComponentError, lookup_env

log = logging.getLogger(__name__)


def lookup(name: str) -> EnvEntry:
    try:
        return lookup_env(name)
    except UnknownComponentError as e:
        raise unknown_component(str(e)) from e


def build_env(name: str, env_args: dict[str, Any]) -> tuple[EnvEntry, Any]:
    """Look the env up and construct it; unknown names and rejected args are bad input (not retried)."""
    entry = lookup(name)
    try:
        return entry, entry.cls(**env_args)
    except (TypeError, ValueError) as e:
        raise bad_input(f"env {name!r} rejected its env_args {env_args!r}: {e}") from e


def reset_now(entry: EnvEntry, env: Any, seed: int) -> str | list[ChatMessage]:
    """env.reset(seed), on an env thread: a raising env is retryable (EnvResetError), a wrong answer is a bug (text
    from a text env, a list of chat messages from a chat env)."""
    try:
        observation = env.reset(seed)
    except Exception as e:
        raise ErrorType.ENV_RESET_ERROR.error(
            f"env {entry.name!r} reset(seed={seed}) raised {type(e).__name__}: {e}"
        ) from e
    if is_chat(env):
        try:
            return as_messages(observation, f"env {entry.name!r}.reset's answer")
        except ValueError as e:
            raise bad_input(str(e)) from e
    if not isinstance(observation, str):
        raise bad_input(f"env {entry.name!r}.reset must return the observation text, got {type(observation).__name__}")
    return observation


def unwrapped(env: Any) -> Any:
    """The user's env inside a fault-injecting wrapper (`FaultyEnv`)."""
    return env.inner if isinstance(env, FaultyEnv) else env


def is_chat(env: Any) -> bool:
    """Whether `env` speaks chat messages (a `ChatEnv`), under any fault injection."""
    return isinstance(unwrapped(env), ChatEnv)


def close_now(entry: EnvEntry, env: Any, owner: str) -> None:
    """env.close(), on an env thread; a close that raises is logged, never raised (the env is done anyway)."""
    try:
        env.close()
    except Exception:
        log.exception("env %s close failed (%s)", entry.name, owner)


def first_observations(name: str, env_args: dict[str, Any], seeds: list[int]) -> list[str]:
    """On an env thread: each seed's first observation, from a throwaway env closed whatever happens."""
    observations = []
    for seed in seeds:
        entry, env = build_env(name, env_args)
        try:
            observations.append(reset_now(entry, env, seed))
        finally:
            close_now(entry, env, "a throwaway env")
    return observations


def play_answers(name: str, env_args: dict[str, Any], seed: int, answers: list[str]) -> list[StepResult]:
    """On an env thread: each answer as the only step of a fresh env reset from `seed`, closed whatever happens."""
    results = []
    for answer in answers:
        entry, env = build_env(name, env_args)
        try:
            reset_now(entry, env, seed)
            try:
                outcome = env.step(answer)
            except EnvSessionLost as e:  # a throwaway env's server went away: a retry builds fresh ones
                raise ErrorType.THROWAWAY_ENV_LOST.error(f"env {entry.name!r} lost its session: {e}") from e
            except Exception as e:
                raise env_broken(f"env {entry.name!r} step raised {type(e).__name__}: {e}") from e
            results.append(step_result(entry, outcome))
        finally:
            close_now(entry, env, "a throwaway env")
    return results


def _scrubbed(messages: list[Any]) -> list[Any]:
    """A chat env's new messages with the worker's secrets scrubbed from their text (infra/secrets.py)."""
    return [
        m.model_copy(update={"content": scrub(m.content)}) if isinstance(m, ChatMessage) and m.content else m
        for m in messages
    ]


def step_result(entry: EnvEntry, outcome: Any) -> StepResult:
    """An env's step outcome as the workflow records it: its observation (what the model's action produced, a tool's
    output among it) scrubbed of this worker's secrets, which a model-written program may have printed."""
    try:
        messages = _scrubbed(outcome.observation) if isinstance(outcome.observation, list) else None
        return StepResult(
            observation=scrub(observation_text(outcome.observation)),
            reward=outcome.reward,
            done=outcome.done,
            info=outcome.info,
            messages=messages,
        )
    except (AttributeError, ValueError) as e:
        raise env_broken(f"env {entry.name!r} step returned {outcome!r}, not a StepOutcome: {e}") from e
