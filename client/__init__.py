"""Client code: what `rollart train`, `rollout`, `eval`, `status` and `plot` do, apart from the worker processes."""
