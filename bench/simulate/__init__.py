"""`python -m bench simulate`: the benchmark side of the simulator (rollart.simulator, docs/simulator.md).

- `setups`: the calibration and paper-like setups (from bench/workload.py's jobs and latencies);
- `placement`: the placement planner against the placements the simulator finds best;
- `views`: the tables of its results; `cli`: the command.
"""
