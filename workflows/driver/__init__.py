"""The rollout logic, written once: reset → (generate → step)* → reward → close, over a small `Calls` interface.

- `calls`: the interface, and `CallFailed`, the one way a failed call reaches the driver;
- `episode`: one trajectory with its own env session; `group`: a GRPO group in one shared session;
- `lockstep`: plays one unit (an episode or a group) or many phase by phase, failures masked per unit;
- `single_turn`: single-turn groups (prompts → generate n → check → reward_batch);
- `affinity`: which engine serves a turn (the previous turn's, through its private queue) and when it falls back
  to the pool's queue; how a single-turn wave splits over the live engines.

Workflows drive it with `TemporalCalls` (activities on their pools' queues); `rollart eval` and the bench's
plain loop with `rollart.client.in_process.InProcessCalls` (the same activity code, in one process).
No I/O here and nothing heavy: it runs inside the workflow sandbox.
"""
