"""The job's reward: the agent's final answer (the workflow's result, `Transcript.final_observation`) names the
city's temperature, in the unit the question asked for (the question is in the first turn's prompt). Rule-based,
so it runs serverless."""

from __future__ import annotations

import re

from examples.temporal_agent.activities import WEATHER
from rollart.sdk import RewardResult, Transcript, reward


def _expected(question: str) -> float | None:
    """The temperature the question asks for (the first turn's prompt holds it), in its unit; None: no city."""
    for key, weather in WEATHER.items():
        if key in question.lower():
            celsius = weather.temperature_c
            return round(celsius * 9 / 5 + 32, 1) if "fahrenheit" in question.lower() else celsius
    return None


@reward("weather_answer", serverless=True)
def weather_answer(t: Transcript) -> RewardResult:
    """1.0 when the answer holds the expected number; 0.1 when the agent at least handed off (its later turns'
    prompts name the weather agent); else 0."""
    want = _expected(t.turns[0].observation) if t.turns else None
    numbers = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", t.final_observation or "")]
    if want is not None and any(abs(n - want) < 0.51 for n in numbers):
        return RewardResult(value=1.0, success=True)
    handed_off = any("Weather agent" in (turn.observation or "") for turn in t.turns[1:])
    return RewardResult(value=0.1 if handed_off else 0.0, success=False)
