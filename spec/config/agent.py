"""A task's `env_args` when `env: agent`: the program rollart runs for each episode, and its time limit.

An agent program is a user's program written against the OpenAI chat API (docs/envs.md). Its env_args are checked
with the job (`spec/checks.py`), before any workflow starts, and parsed again by the workflow that runs it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["AgentArgs"]


class AgentArgs(BaseModel):
    """A task's `env_args` when `env: agent`: the program to run, one of `entry` or `command`, and its time limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entry: str | None = Field(None, min_length=1, description="`module:function` called as run(base_url, seed)")
    command: list[str] | None = Field(
        None, min_length=1, description="a subprocess given ROLLART_BASE_URL and ROLLART_SEED in its environment"
    )
    timeout_s: float = Field(300.0, gt=0.0, description="the episode's wall-clock limit: past it, it fails (masked)")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables of a `command`")

    @classmethod
    def parse(cls, env_args: dict[str, Any]) -> AgentArgs:
        """A task's env_args as an agent program's, or a ValueError with one line per problem."""
        try:
            return cls.model_validate(env_args)
        except ValidationError as e:
            problems = [f"{'.'.join(map(str, err['loc'])) or 'env_args'}: {err['msg']}" for err in e.errors()]
            raise ValueError("; ".join(problems)) from None

    @model_validator(mode="after")
    def _one_program(self) -> AgentArgs:
        if (self.entry is None) == (self.command is None):
            raise ValueError(
                "env: agent needs exactly one of env_args.entry ('mypkg.agent:run', called as run(base_url, seed)) "
                "or env_args.command (a program run with ROLLART_BASE_URL and ROLLART_SEED set)"
            )
        if self.entry is not None and ":" not in self.entry:
            raise ValueError(f"env_args.entry {self.entry!r} must be 'module:function'")
        return self
