"""Liveness: each worker process touches a file of its own in the state
directory every few seconds, from a thread of its own, beat touches its
file each time it sends a task, and ``chorus alive`` checks the age.

A liveness probe decides when a container is restarted. A Celery ping goes
through the broker, so a Redis outage longer than the probe's patience
would restart every worker and cut off the model calls they were paying
for; readiness may depend on Redis, liveness must not. The file shows that
the process runs and its interpreter is not stuck (a thread that cannot
get the GIL for a minute does not touch it).

Beat is different: it holds no work, and one that cannot send (its
connection to the result store gave up after an outage: "the Celery
application must be restarted") sweeps nothing ever again. So its file
shows that it sent a task (a sweep, every ``CHORUS_SWEEP_INTERVAL``), and
its probe restarts it when it has not for a while, Redis down or not.

Imports neither Celery nor litellm: the probe starts quickly.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: Seconds between two touches of a process's file.
EVERY = 10.0


def beats_dir(state_dir: Path) -> Path:
    """Where the processes of this host (or pod) keep their files."""
    return state_dir / "alive"


def touch(state_dir: Path, node: str) -> None:
    """Mark ``node`` alive now (``<state_dir>/alive/<node>``)."""
    path = beats_dir(state_dir) / node.replace("/", "_")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:  # the probe will say so; keep trying
        log.warning("liveness file %s: %s", path, exc)


def start_heartbeat(state_dir: Path, node: str, every: float = EVERY) -> threading.Thread:
    """Touch ``node``'s file now and every ``every`` seconds, from a daemon
    thread, for as long as the process runs."""

    def beat() -> None:
        while True:
            touch(state_dir, node)
            time.sleep(every)

    thread = threading.Thread(target=beat, name="chorus-alive", daemon=True)
    thread.start()
    return thread


def age(state_dir: Path, pattern: str) -> float | None:
    """Seconds since the freshest file of a node matching ``pattern`` (a
    regular expression) was touched; None if there is none."""
    try:
        found = [p for p in beats_dir(state_dir).iterdir() if re.fullmatch(pattern, p.name)]
    except OSError:
        return None
    if not found:
        return None
    return max(0.0, time.time() - max(p.stat().st_mtime for p in found))
