"""How a Temporal-native agent's workflow is named and where it runs: its id names the trajectory that started it,
so that its model calls (activities/agents_sdk.py) find their way back to that trajectory's endpoint.

A trajectory's own agent workflow is `<trajectory workflow id>/agent`; a group's member's is `<group workflow
id>/<trajectory id>/agent`. Workflow and trajectory ids never hold a `/` (the endpoint's URLs name them as path
segments), so the id parses back without ambiguity.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["AGENT_QUEUE_SUFFIX", "AgentOwner", "agent_owner", "agent_queue", "agent_workflow_id"]

_SUFFIX = "/agent"

AGENT_QUEUE_SUFFIX = "-agents"
"""The env pool's queue for the user's agent workflows and their activities (`<pool queue>-agents`): polled only by
the env workers that registered them (workers/agent_worker.py), never by rollart's own."""


class AgentOwner(NamedTuple):
    """The trajectory an agent workflow plays for: the workflow that plays it, and which of its members ("": the
    workflow's own trajectory)."""

    workflow_id: str
    trajectory: str = ""


def agent_workflow_id(workflow_id: str, trajectory: str = "") -> str:
    """The id of the agent workflow that a trajectory (a workflow's own, or its member `trajectory`) starts."""
    return f"{workflow_id}/{trajectory}{_SUFFIX}" if trajectory else f"{workflow_id}{_SUFFIX}"


def agent_owner(agent_workflow: str) -> AgentOwner | None:
    """The trajectory an agent workflow's id names; None for an id that no trajectory gave."""
    if not agent_workflow.endswith(_SUFFIX):
        return None
    parts = agent_workflow[: -len(_SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return AgentOwner(parts[0])
    if len(parts) == 2 and all(parts):
        return AgentOwner(parts[0], parts[1])
    return None


def agent_queue(env_queue: str) -> str:
    """The queue of the agent workflows whose trajectories' env sessions would live on `env_queue`."""
    return f"{env_queue}{AGENT_QUEUE_SUFFIX}"
