"""What crosses the agent endpoint: an agent program's chat request as the trajectory's `chat` update takes it, the
reply, the `run_agent` activity's input and result, and the task's `env_args` for an agent program.

An agent program (`env: agent`) is a user's program written against the OpenAI chat API; rollart runs it on an env
worker (`run_agent`) and serves its chat requests as turns of its trajectory's workflow (docs/envs.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollart.contracts.errors import ErrorType
from rollart.spec.chat import ChatMessage, ToolCall
from rollart.spec.config.agent import AgentArgs

__all__ = [
    "CHAT_UPDATE",
    "ChatInput",
    "ChatReply",
    "RunAgentInput",
    "RunAgentResult",
    "TurnRefused",
]

CHAT_UPDATE = "chat"
"""The TrajectoryWorkflow update an agent program's chat request becomes (one turn each)."""


class TurnRefused:
    """The error types a refused `chat` update carries (the endpoint answers them with HTTP 400)."""

    MAX_TURNS = ErrorType.MAX_TURNS_REACHED
    NOT_AN_AGENT = ErrorType.NOT_AN_AGENT_TRAJECTORY
    AGENT_DONE = ErrorType.AGENT_DONE
    REJECTED = ErrorType.REQUEST_REJECTED
    HISTORY_MISMATCH = ErrorType.HISTORY_MISMATCH


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True)


class ChatInput(_Message):
    """One chat-completions request of an agent program: its messages (the whole history, as OpenAI's API takes
    it, or only its new messages after `history_len` held ones) and tools. Sampling is the task's (`sampling`):
    the policy being trained decides how it samples."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    history_len: int = Field(0, ge=0)
    """When the request continues what the trajectory holds: how many of its messages that is (left out here:
    `messages` are the new ones only, and `tools` are the held ones); 0: `messages` is the whole request."""
    history_digest: str = ""
    """With `history_len`: the held conversation's digest (contracts/conversation.py), checked by the workflow."""
    trajectory: str = ""
    """The trajectory the request is for, in a workflow that plays several (a group's free members); "": the
    workflow's own."""


class ChatReply(_Message):
    """The reply to one request: the assistant message and what the endpoint reports of it."""

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    policy_version: int = 0
    turn: int = 0
    """This turn's index in the trajectory (0 first)."""


class RunAgentInput(_Message):
    """Run one episode of an agent program; its chat requests become updates of the workflow that called."""

    args: AgentArgs
    seed: int
    trajectory: str = ""
    """The trajectory the program plays when its workflow plays several (a group's free members): its base URL
    names it. "": the workflow's own."""


class RunAgentResult(_Message):
    """What the program returned: its reward (None: the task's reward scores the transcript) and success."""

    reward: float | None = None
    success: bool | None = None
