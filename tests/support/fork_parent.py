"""A parent for lifeline tests: forks one sleeping child (multiprocessing, fork), prints its pid, waits to be killed.

`python -m tests.support.fork_parent hooked` calls `children_die_with_me()` first; `plain` does not.
"""

from __future__ import annotations

import multiprocessing
import sys
import time

from rollart.workers import lifeline

if __name__ == "__main__":
    if sys.argv[1] == "hooked":
        lifeline.children_die_with_me()
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    print(child.pid, flush=True)
    time.sleep(60)
