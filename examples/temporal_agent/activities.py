"""The weather agent's activity tool: a Temporal activity, run on the agent worker, that the model calls by name
(`activity_as_tool` in workflows.py). A real one would call a weather service; this one reads a table."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import activity


@dataclass
class Weather:
    city: str
    temperature_c: float
    conditions: str


WEATHER = {
    "paris": Weather("Paris", 18.0, "cloudy"),
    "tokyo": Weather("Tokyo", 24.0, "sunny"),
    "lima": Weather("Lima", 16.0, "foggy"),
    "oslo": Weather("Oslo", 3.0, "snowing"),
}


@activity.defn
async def get_weather(city: str) -> Weather:
    """Get the current weather in a city (Paris, Tokyo, Lima or Oslo)."""
    found = WEATHER.get(city.strip().lower())
    return found or Weather(city, float("nan"), "unknown: no weather station there")
