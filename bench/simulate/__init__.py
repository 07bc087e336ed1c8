"""`python -m bench simulate`: rollart's own scheduling code (admission, ledger, staleness, the rollout driver)
driven in virtual time on a simulated cluster of vLLM engines, env sandboxes and a trainer (docs/simulator.md).

- `clock`: the asyncio loop on virtual time; `roofline`: H800/H20 engines from public specs;
- `engine`: a continuous-batching engine with vLLM's priority queue; `cluster`: pools of them, and routing;
- `models`: env, reward, token and trainer models; `calls`: `SimCalls`, the driver's `Calls` on that world;
- `shell`: the training workflow's loop around its pure modules; `run`: one run, summed up in a row;
- `setups`: the calibration and paper-like setups; `cli`: the command.
"""
