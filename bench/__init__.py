"""Benchmarks that print comparison tables: `python -m bench NAME [--quick]` (see docs/benchmarks.md)."""
