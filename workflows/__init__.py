"""Temporal workflows only: deterministic orchestration, no I/O, no torch or vLLM."""
