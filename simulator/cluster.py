"""The simulated generation pools: engines per pool, and which engine a generation request lands on.

A pool is `gpus` GPUs of one kind in engines of `tp` GPUs each. A request on a pool's shared queue goes to the
less loaded of two engines drawn at random (power of two choices: what pull-based workers polling one queue
come close to, at O(1) per request whatever the pool's size); one on an engine's private queue
(`h800@h800-3`, session affinity) goes to that engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from rollart.simulator.engine import SimEngine
from rollart.simulator.roofline import GPUS, EngineRoofline, GpuSpec, ModelSpec

__all__ = ["Cluster", "PoolSpec"]


@dataclass(frozen=True)
class PoolSpec:
    """One generation pool: its name (the task queue tasks name as `generate_pool`), GPU kind, size and engines."""

    name: str
    gpu: str | GpuSpec  # "h800", "h20" (GPUS) or a spec of its own
    gpus: int
    tp: int = 1
    max_num_seqs: int = 256
    mfu: float = 0.5
    mbu: float = 0.8
    overhead_s: float = 0.003
    kv_capacity: int = 0  # tokens per engine; 0: what the GPUs' memory leaves beside the weights
    request_s: float = 0.0  # per request, serial on its engine (a CPU worker's own work; ~0 on GPUs)

    @property
    def engines(self) -> int:
        return max(1, self.gpus // self.tp)


class Cluster:
    """Every pool's engines, by pool and by name; routes requests and reports each pool's utilisation."""

    def __init__(self, pools: list[PoolSpec], model: ModelSpec, version: Callable[[], int], seed: int = 0) -> None:
        self.specs = {p.name: p for p in pools}
        self.pools: dict[str, list[SimEngine]] = {}
        self.by_name: dict[str, SimEngine] = {}
        self._rng = random.Random(seed)
        for p in pools:
            gpu = GPUS[p.gpu] if isinstance(p.gpu, str) else p.gpu
            roof = EngineRoofline(gpu, model, tp=p.tp, mfu=p.mfu, mbu=p.mbu, overhead_s=p.overhead_s)
            engines = [
                SimEngine(
                    f"{p.name}-{i}",
                    p.name,
                    roof,
                    version,
                    max_num_seqs=p.max_num_seqs,
                    kv_capacity=p.kv_capacity,
                    request_s=p.request_s,
                )
                for i in range(p.engines)
            ]
            self.pools[p.name] = engines
            self.by_name.update((e.name, e) for e in engines)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.specs.values())

    def route(self, queue: str) -> SimEngine:
        """The engine that serves a request sent to `queue` (a pool's shared queue or an engine's private one)."""
        pool, _, engine = queue.partition("@")
        if engine:
            return self.by_name[engine]
        engines = self.pools.get(pool)
        if not engines:
            raise KeyError(f"no simulated pool {pool!r}; pools: {', '.join(self.pools)}")
        if len(engines) == 1:
            return engines[0]
        a, b = self._rng.choice(engines), self._rng.choice(engines)
        return a if a.load <= b.load else b

    def private_queues(self, pool: str) -> list[str]:
        return [f"{e.pool}@{e.name}" for e in self.pools.get(pool, [])]

    def utilisation(self, elapsed_s: float) -> dict[str, float]:
        """Each pool's share of engine time spent iterating (at least one request running)."""
        if elapsed_s <= 0:
            return dict.fromkeys(self.pools, 0.0)
        return {name: sum(e.busy_s for e in es) / (len(es) * elapsed_s) for name, es in self.pools.items()}

    def tokens_out(self) -> dict[str, int]:
        return {name: sum(e.tokens_out for e in es) for name, es in self.pools.items()}
