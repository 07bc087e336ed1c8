"""The worker that runs a job's Temporal-native agents: the user's agent workflows and their activities, registered
with Temporal's OpenAI Agents SDK plugin, on the env pool's agent queue (`spec.pools.agent_queue`).

It is a worker of its own, on a queue of its own, because the plugin needs its own data converter (it refuses
rollart's claim-checking one) and because only the processes that can import the user's workflows may poll for
them. Its model calls go to this process's agent endpoint (activities/agents_sdk.py), so each is a turn of the
trajectory that started the agent workflow.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client, Plugin
from temporalio.common import RetryPolicy
from temporalio.converter import DataConverter
from temporalio.worker import Worker

from rollart.activities.agent_endpoint import AgentEndpoint
from rollart.spec.imports import resolve_import_path

__all__ = ["MODEL_CALL_TIMEOUT", "agent_worker", "agents_plugins"]

MODEL_CALL_TIMEOUT = timedelta(minutes=10)
"""How long one model call may take: a turn waits for its generation, which may queue behind others (the plugin
needs a bound when the provider is not its own)."""

MODEL_CALL_ATTEMPTS = 5
"""A model call that keeps failing (its endpoint gone, its trajectory refusing) fails the agent workflow after this
many tries, which fails the trajectory (masked) instead of retrying forever. A retry is the same turn (its
idempotency key)."""


def agent_worker(
    client: Client,
    task_queue: str,
    workflows: Sequence[str],
    activities: Sequence[str],
    endpoint: AgentEndpoint,
    model_call_timeout: timedelta = MODEL_CALL_TIMEOUT,
    **options: Any,
) -> Worker:
    """A worker for the user's agent `workflows` and `activities` (import paths), with `agents_plugins`."""
    # The Agents SDK exports its traces to OpenAI's platform by default: a training job's are read in the Temporal
    # UI instead (and its env workers need no OpenAI key). A worker started with the variable set keeps its value.
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    config = client.config()
    config.update(data_converter=DataConverter.default, plugins=agents_plugins(endpoint, model_call_timeout))
    return Worker(
        Client(**config),
        task_queue=task_queue,
        workflows=[resolve_import_path(w) for w in workflows],
        activities=[resolve_import_path(a) for a in activities],
        **options,
    )


def agents_plugins(endpoint: AgentEndpoint, model_call_timeout: timedelta = MODEL_CALL_TIMEOUT) -> list[Plugin]:
    """What the user's agent workflows run with, and what replays their histories: Temporal's OpenAI Agents SDK
    plugin with rollart's model provider, and a plugin of rollart's under which an Agents SDK error raised in an
    agent workflow fails it (a `MaxTurnsExceeded` ends the episode, scored) instead of retrying its workflow task
    forever."""
    from agents.exceptions import AgentsException
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.plugin import SimplePlugin

    from rollart.activities.agents_sdk import RolloutModelProvider

    sdk = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(
            start_to_close_timeout=model_call_timeout,
            retry_policy=RetryPolicy(maximum_attempts=MODEL_CALL_ATTEMPTS),
        ),
        model_provider=RolloutModelProvider(endpoint),
    )
    episodes_end = SimplePlugin(
        "rollart.AgentEpisodes",
        workflow_failure_exception_types=lambda given: [*(given or []), AgentsException],
    )
    return [sdk, episodes_end]
