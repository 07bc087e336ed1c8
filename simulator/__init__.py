"""`rollart.simulator`: the training loop and the rollout driver, run in virtual time on a simulated cluster of
vLLM engines, env sandboxes and a trainer (docs/simulator.md). `python -m bench simulate` is its command.

It runs rollart's own code, not a model of it: the loop core (workflows/training/loop.py, which
`TrainingWorkflow` calls too), admission and the rollout driver, on a world that answers in virtual time.

- `clock`: the asyncio loop on virtual time; `roofline`: H800/H20 engines from public specs;
- `engine`: a continuous-batching engine with vLLM's priority queue; `cluster`: pools of them, and routing;
- `models`: env, reward, token and trainer models; `calls`: `SimCalls`, the driver's `Calls` on that world;
- `shell`: the second shell of the training loop; `readiness`: the ledger's answers, indexed for scale;
- `run`: one run of a `Setup`, summed up in a row.
"""
