"""A stand-in local stack for lifeline tests: spawns one cpu worker (against HOME/ADDRESS), prints its pid, waits.

`python -m tests.support.spawn_parent HOME ADDRESS`
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rollart.spec.config import StoreConfig, TemporalConfig
from rollart.spec.pools import Pool
from rollart.workers.autoscaler import spawn_worker
from rollart.workers.settings import WorkerSettings

if __name__ == "__main__":
    home, address = Path(sys.argv[1]), sys.argv[2]
    settings = WorkerSettings(
        pool=Pool.CPU, temporal=TemporalConfig(address=address), store=StoreConfig(path=home / "store")
    )
    print(spawn_worker(settings, "cpu-0", home).pid, flush=True)
    time.sleep(120)
