"""Everything that crosses a process boundary: activity and workflow inputs and results, store records, error types.

Pydantic models and enums only — no I/O, no heavy imports — so workflows, activities, workers and
clients all import the same definitions. New fields get defaults so that running histories keep decoding.
"""
