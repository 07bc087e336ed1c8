"""The model provider of Temporal-native agents: each model call of a user's agent workflow becomes a turn of the
trajectory that started it.

A Temporal-native agent is a workflow written for Temporal's OpenAI Agents SDK integration (`temporalio-openai-
agents`), with no rollart import. The integration runs each model call as an activity (`invoke_model_activity`),
which asks its `ModelProvider` for a model. This provider answers with the Agents SDK's own chat-completions model,
pointed at the trajectory's endpoint in this process (activities/agent_endpoint.py). So a model call is the
trajectory's `chat` update, sampled by the policy being trained and recorded token by token, as an agent program's
request is. The agent workflow's id names its trajectory (`contracts.agent_workflow.agent_owner`). A secret is
granted for the call and revoked after it. The activity's own identity (workflow, run, activity id) is the
request's idempotency key, so a retried call gets the first call's reply and the trajectory records one turn.

The Agents SDK is imported here and by the worker that registers the user's workflows (workers/agent_worker.py),
never by rollart's own workflows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents import Model, ModelProvider, ModelResponse, OpenAIChatCompletionsModel
from openai import AsyncOpenAI
from temporalio import activity

from rollart.activities.agent_endpoint import IDEMPOTENCY_HEADER, MODEL_NAME, AgentEndpoint
from rollart.contracts.agent_workflow import AgentOwner, agent_owner
from rollart.contracts.errors import ErrorType

__all__ = ["RolloutModelProvider"]


class RolloutModelProvider(ModelProvider):
    """Models that answer through the calling agent workflow's trajectory (one endpoint per worker process)."""

    def __init__(self, endpoint: AgentEndpoint) -> None:
        self.endpoint = endpoint

    def get_model(self, model_name: str | None) -> Model:
        """The model for one model activity: its workflow names the trajectory, its ids the idempotency key."""
        info = activity.info()
        owner = agent_owner(info.workflow_id)
        if owner is None:
            raise ErrorType.INVALID_INPUT.error(
                f"agent workflow {info.workflow_id!r} was not started by a rollart trajectory: its model calls "
                "have no policy to answer them (start it from a task with env: agent and env_args.workflow)"
            )
        key = f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"
        return _TrajectoryModel(self.endpoint, owner, model_name or MODEL_NAME, key)


class _TrajectoryModel(Model):
    """The Agents SDK's chat-completions model, at the trajectory's URL, with a secret that lives for one call."""

    def __init__(self, endpoint: AgentEndpoint, owner: AgentOwner, model_name: str, key: str) -> None:
        self.endpoint, self.owner, self.model_name, self.key = endpoint, owner, model_name, key

    async def _client(self, secret: str) -> AsyncOpenAI:
        await self.endpoint.start()
        return AsyncOpenAI(
            base_url=self.endpoint.base_url(self.owner.workflow_id, self.owner.trajectory),
            api_key=secret,
            max_retries=0,  # the model activity's retry policy retries, with the same idempotency key
            default_headers={IDEMPOTENCY_HEADER: self.key},
        )

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """One chat request through the endpoint: one turn of the trajectory."""
        secret = self.endpoint.grant(self.owner.workflow_id, self.owner.trajectory)
        try:
            async with await self._client(secret) as client:
                model = OpenAIChatCompletionsModel(self.model_name, client)
                return await model.get_response(*args, **kwargs)
        finally:
            self.endpoint.revoke(secret)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        """`Runner.run_streamed`: the same turn, its reply streamed as one chunk."""
        secret = self.endpoint.grant(self.owner.workflow_id, self.owner.trajectory)
        try:
            async with await self._client(secret) as client:
                model = OpenAIChatCompletionsModel(self.model_name, client)
                async for event in model.stream_response(*args, **kwargs):
                    yield event
        finally:
            self.endpoint.revoke(secret)
