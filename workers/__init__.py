"""Processes: a Temporal worker per pool, the local stack, and the `rollart` CLI."""
