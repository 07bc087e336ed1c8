"""A stand-in local stack for lifeline tests: starts a dev server and a Mooncake master and keeper under HOME,
prints their pids on one line, and waits to be killed.

`python -m tests.support.server_parent HOME`
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rollart.infra.local.devserver import DevServer, free_port
from rollart.infra.local.mooncake_service import MooncakeService
from rollart.spec.config import StoreConfig

if __name__ == "__main__":
    home = Path(sys.argv[1])
    server = DevServer(db_file=home / "t.db", port=free_port(), ui_port=None).start()
    store = StoreConfig(kind="mooncake", path=home / "store", mooncake={"keeper_segment_mib": 64})
    mooncake = MooncakeService(store, log_dir=home / "logs").start()
    assert mooncake.master_proc is not None and mooncake.keeper_proc is not None
    print(server.pid, mooncake.master_proc.pid, mooncake.keeper_proc.pid, flush=True)
    time.sleep(120)
