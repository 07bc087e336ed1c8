"""Processes: a Temporal worker per pool, the local stack and its autoscaler, the trainer's ranks."""
