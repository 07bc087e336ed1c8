"""A task's `env_args` when `env: agent`: the program rollart runs for each episode, and its time limit.

An agent program is a user's program written against the OpenAI chat API, or a Temporal-native agent: a workflow
written for Temporal's OpenAI Agents SDK integration, started as a child of each trajectory (docs/envs.md). Its
env_args are checked with the job (`spec/checks.py`), before any workflow starts, and parsed again by the workflow
that runs it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["AgentArgs", "FromEnv"]


class FromEnv(BaseModel):
    """An agent command's variable whose value is the worker's own variable `from_env`, read as the program starts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    from_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class AgentArgs(BaseModel):
    """A task's `env_args` when `env: agent`: the program to run, one of `entry` or `command`, and its time limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entry: str | None = Field(
        None, min_length=1, description="`module:function` called as run(base_url, seed, api_key=<its secret>)"
    )
    command: list[str] | None = Field(
        None,
        min_length=1,
        description="a subprocess given OPENAI_BASE_URL, OPENAI_API_KEY (its secret), ROLLART_BASE_URL and "
        "ROLLART_SEED in its environment",
    )
    workflow: str | None = Field(
        None,
        min_length=1,
        description="`module:Class` of a Temporal workflow written for Temporal's OpenAI Agents SDK integration: each "
        "trajectory starts it as its child, with the seed's input, and its model calls are the trajectory's turns",
    )
    workflow_type: str | None = Field(
        None, min_length=1, description="the workflow's registered name, when `@workflow.defn(name=...)` gives one"
    )
    activities: list[str] = Field(
        default_factory=list, description="`workflow`: `module:function` of each activity its agents use as a tool"
    )
    input: Any = Field(None, description="`workflow`: the input every episode starts it with")
    inputs: list[Any] | None = Field(
        None, min_length=1, description="`workflow`: the inputs to start it with; seed s gets inputs[s % len(inputs)]"
    )
    timeout_s: float = Field(300.0, gt=0.0, description="the episode's wall-clock limit: past it, it fails (masked)")
    env: dict[str, str | FromEnv] = Field(
        default_factory=dict,
        description="extra environment variables of a `command`: a value, or `{from_env: NAME}` to pass the worker's "
        "own variable NAME (a secret the job names but does not hold: it stays out of the spec, the history and the "
        "job's ConfigMap, and is scrubbed from what the program prints)",
    )

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
        if sum(x is not None for x in (self.entry, self.command, self.workflow)) != 1:
            raise ValueError(
                "env: agent needs exactly one of env_args.entry ('mypkg.agent:run', called as run(base_url, seed, "
                "api_key)), env_args.command (a program run with OPENAI_BASE_URL and OPENAI_API_KEY set) or "
                "env_args.workflow ('mypkg.agents:MyAgentWorkflow', a Temporal workflow using the OpenAI Agents SDK)"
            )
        paths = {"entry": (self.entry, "function"), "workflow": (self.workflow, "Class")}
        paths.update({f"activities.{i}": (a, "function") for i, a in enumerate(self.activities)})
        for name, (path, kind) in paths.items():
            if path is not None and ":" not in path:
                raise ValueError(f"env_args.{name} {path!r} must be 'module:{kind}'")
        if self.workflow is None and (self.activities or self.input is not None or self.inputs is not None):
            raise ValueError("env_args.activities, input and inputs belong to an agent workflow (env_args.workflow)")
        if self.input is not None and self.inputs is not None:
            raise ValueError("env_args: give the agent workflow's input or inputs, not both")
        return self

    @property
    def workflow_name(self) -> str:
        """The agent workflow's type: `workflow_type`, else its class name (`@workflow.defn`'s default)."""
        assert self.workflow is not None
        return self.workflow_type or self.workflow.rpartition(":")[2]

    def input_of(self, seed: int) -> Any:
        """The input an episode of `seed` starts the agent workflow with."""
        return self.inputs[seed % len(self.inputs)] if self.inputs is not None else self.input
