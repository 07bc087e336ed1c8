"""A triage agent that hands weather questions off to a weather agent, written for Temporal's OpenAI Agents SDK
integration (`temporalio-openai-agents`) in the style of temporalio/samples-python `openai_agents/`, with no
rollart import.

The weather agent has an activity tool (`get_weather`, a Temporal activity) and a function tool (`to_fahrenheit`,
run inside the workflow). Deployed on its own worker with `OpenAIAgentsPlugin`, this workflow calls OpenAI's
models; rollart runs it unchanged as the episode of each trajectory of examples/temporal_agent/job.yaml, and its
model calls are answered, and trained, by the policy (docs/envs.md, "Temporal-native agents").
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.openai_agents import workflow as agents_workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner, function_tool

    from examples.temporal_agent.activities import get_weather


@function_tool
async def to_fahrenheit(
    celsius: float,
) -> float:  # async: the SDK runs a sync tool in a thread, which a workflow may not
    """Convert a temperature from degrees Celsius to degrees Fahrenheit."""
    return round(celsius * 9 / 5 + 32, 1)


def weather_agent() -> Agent:
    return Agent(
        name="Weather agent",
        handoff_description="Answers questions about the current weather in a city.",
        instructions="Look the weather up with get_weather, convert to Fahrenheit when asked, and answer in one "
        "sentence that names the temperature.",
        tools=[
            agents_workflow.activity_as_tool(get_weather, start_to_close_timeout=timedelta(seconds=10)),
            to_fahrenheit,
        ],
    )


@workflow.defn
class TriageWorkflow:
    @workflow.run
    async def run(self, question: str) -> str:
        triage = Agent(
            name="Triage agent",
            instructions="Hand any question about the weather to the weather agent. Answer others yourself, briefly.",
            handoffs=[weather_agent()],
        )
        result = await Runner.run(triage, input=question, max_turns=6)
        return str(result.final_output)
