"""Temporal: connecting (TLS, API keys), tracing, search attributes, worker liveness, histories."""
