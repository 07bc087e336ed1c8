"""The env contract users implement: `reset(seed) -> observation` and `step(action) -> StepOutcome`.

An env lives as a session in one cpu worker's process, so it may keep state
between calls. Three rules keep every env usable by the same rollout loop:

- The observation *is* the whole prompt of the next turn. The rollout loop
  adds nothing to it; an env that wants the policy to see history puts that
  history into the observation itself.
- An action is the raw text the model generated. An action the env cannot
  understand is handled by the env's own rule (e.g. a no-op with
  ``info["valid"] = False``) and never by raising: bad model output is
  ordinary data for RL, not an error.
- Raising from `reset` or `step` means the env itself is broken (or was
  misused by its caller) and is treated as an infrastructure failure, not
  as a low reward. An env whose state lives elsewhere (a server's session)
  raises `EnvSessionLost` from `step` when that state is gone: the episode
  is then rebuilt on a fresh env (same seed, its actions replayed), not failed.

A `ChatEnv` speaks chat messages instead: `reset` returns the opening messages (system, user), `step`
receives the assistant message the model wrote (its native tool calls parsed by the task's tool parser)
and returns the messages that follow it (tool outputs, a user's reply). The conversation is the prompt:
the generation worker appends each turn's new messages to the conversation's tokens, so a chat env returns
only what is new, never the history.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from rollart.spec.chat import ChatMessage, as_messages, messages_text

__all__ = ["ChatEnv", "Env", "EnvSessionLost", "StepOutcome", "declares_actions", "observation_text"]


class EnvSessionLost(ConnectionError):
    """The env's remote session is gone (its server died or restarted): this env cannot go on, a fresh one can.

    Raised from `step`; the session is restored elsewhere by replaying the episode's actions on a new env
    reset from the same seed (the env must be deterministic in (seed, actions)), and the step is played there.
    """


@dataclass(frozen=True)
class StepOutcome:
    """What one `step` returns; checked on construction because it crosses a process boundary.

    `info` must be JSON-serialisable (str/int/float/bool/None, lists and
    str-keyed dicts of those) so it can travel in activity results and land
    in metrics unchanged.
    """

    observation: str | list[ChatMessage]
    reward: float
    done: bool
    info: dict[str, Any]

    def __post_init__(self) -> None:
        if isinstance(self.observation, list):  # a chat env's new messages (dicts in OpenAI's shape are taken too)
            try:
                object.__setattr__(
                    self, "observation", as_messages(self.observation, "StepOutcome.observation", allow_empty=True)
                )
            except ValueError as e:
                raise TypeError(str(e)) from e
        elif not isinstance(self.observation, str):
            raise TypeError(f"StepOutcome.observation must be str, got {type(self.observation).__name__}")
        if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)) or not math.isfinite(self.reward):
            raise TypeError(f"StepOutcome.reward must be a finite float, got {self.reward!r}")
        if not isinstance(self.done, bool):
            raise TypeError(f"StepOutcome.done must be bool, got {type(self.done).__name__}")
        if not isinstance(self.info, dict):
            raise TypeError(f"StepOutcome.info must be a dict, got {type(self.info).__name__}")
        _check_json(self.info, "info")


class Env(ABC):
    """A stateful env living in a cpu worker's process as a session.

    Constructed with the task's ``env_args`` as keyword arguments. Subclasses
    take the arguments they know as keyword parameters, validate them
    (raising ValueError that names the argument and its allowed values) and
    pass whatever is left to ``super().__init__(**rest)``, which rejects
    unknown arguments so a typo in a job config fails loudly.
    """

    def __init__(self, **env_args: Any) -> None:
        if env_args:
            raise ValueError(
                f"{type(self).__name__}: unknown env_args {sorted(env_args)}; "
                "check the spelling against the env's documented arguments"
            )

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start an episode determined by `seed`; return the first observation (the first prompt)."""

    @abstractmethod
    def step(self, action: str) -> StepOutcome:
        """Apply the model's raw generated text `action`; return the next observation, reward and done."""

    def close(self) -> None:  # noqa: B027 - a deliberate no-op default, not an abstract method
        """Release resources when the session ends; most envs hold none."""

    def action_of(self, text: str) -> str | None:
        """The action this env reads in generated `text` (None: no valid action), for envs that declare their actions.

        Why: with `trainer.loss.entropy_over: actions` the trainer measures entropy over the env's actions, not
        over the vocabulary, so an exploration bonus keeps the policy trying other *moves* instead of spreading
        mass over tokens the env reads as nothing. Envs that do not override this cannot be used that way.
        """
        raise NotImplementedError(f"{type(self).__name__} does not declare its actions (Env.action_of)")


class ChatEnv(Env):
    """An env that speaks chat messages: the opening messages from `reset`, the assistant's message to `step`.

    `tools` are the function tools the model may call, as JSON schemas in OpenAI's shape
    (`{"type": "function", "function": {"name", "description", "parameters"}}`); the model's chat template
    renders them into the first prompt. A reply whose tool call did not parse arrives with no `tool_calls` and
    `tool_error` set: an invalid action, judged by the env's own rule like any other.
    """

    tools: ClassVar[list[dict[str, Any]]] = []

    @abstractmethod
    def reset(self, seed: int) -> list[ChatMessage]:  # type: ignore[override]
        """Start an episode determined by `seed`; return its opening messages."""

    @abstractmethod
    def step(self, action: ChatMessage) -> StepOutcome:  # type: ignore[override]
        """Answer the assistant's message: `StepOutcome.observation` is the list of messages that follow it."""

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools of this env (its class's `tools` by default; override for tools that depend on env_args)."""
        return list(self.tools)


def observation_text(observation: str | list[ChatMessage]) -> str:
    """An observation as text: a text env's as it is, a chat env's messages as lines of `role: content`."""
    return observation if isinstance(observation, str) else messages_text(observation)


def declares_actions(env_cls: type[Env]) -> bool:
    """Whether `env_cls` overrides `Env.action_of`, so entropy over its actions can be measured."""
    return getattr(env_cls, "action_of", Env.action_of) is not Env.action_of


def _check_json(value: Any, where: str) -> None:
    """Reject values that JSON (and hence activity payloads) cannot carry unchanged."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"StepOutcome.{where} is {value!r}; JSON has no NaN/inf")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"StepOutcome.{where} has non-str key {key!r}")
            _check_json(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"StepOutcome.{where} is a {type(value).__name__}; info must hold only "
        "str/int/float/bool/None, lists and str-keyed dicts"
    )
