"""Several worker processes under one command (``chorus worker --processes N``).

A Celery worker with a threads pool is one Python process, and the GIL
binds it to one core: a model step's own CPU (serializing, parsing
streamed chunks, bookkeeping) queues behind every other step of that
process. The supervisor starts N ``chorus worker`` processes with the same
queues, pool and concurrency, each its own Celery node (``NAME-1@HOST``,
``NAME-2@HOST``, ...), so the steps of one host spread over every core.

- SIGTERM, SIGINT and SIGQUIT are forwarded to every child once (Celery's
  warm, warm and cold shutdown); the supervisor then waits for them and
  exits 0 when they stopped cleanly.
- A child that dies (OOM-killed, a crash) is restarted at once: its
  unfinished tasks come back as any dead worker's do (late acks, the
  sweeper). A child that exits with an error ``CRASH_LIMIT`` times within
  ``CRASH_WINDOW`` seconds (a configuration that fails at start) stops the
  others, and the supervisor exits with that child's status, so the
  container or unit restarts the whole. A death by a signal (a tool that
  kills its process, the OOM killer) is not counted: giving up would stop
  every other call of the host, and a tool's runs of one call are bounded
  by the engine (``CHORUS_MAX_TOOL_ATTEMPTS``).
- A child that exits 0 on its own (a ``celery control shutdown``) is not
  restarted; when all have, the supervisor exits 0.
- The children run in their own session (a terminal's Ctrl-C reaches them
  once, through the supervisor) and get SIGTERM if the supervisor dies
  (Linux ``PR_SET_PDEATHSIG``), so none is left behind.

The supervisor imports neither Celery nor litellm: it stays small.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

log = logging.getLogger(__name__)

#: Deaths of one child within CRASH_WINDOW seconds that end the supervisor.
CRASH_LIMIT = 3
CRASH_WINDOW = 60.0
#: Seconds between checks of the children.
POLL = 0.5
#: Signals forwarded to the children (they stop the supervisor too).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
_PR_SET_PDEATHSIG = 1


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2
    CPU quota (``docker --cpus``, a Kubernetes CPU limit), rounded up."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    return max(1, min(cores, math.ceil(int(quota) / int(period))))


def parse_processes(value: str) -> int:
    """``auto`` (one a core, see available_cores) or a positive integer."""
    from orchestrator.errors import InvalidRequestError

    if value.strip().lower() == "auto":
        return available_cores()
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise InvalidRequestError(
            f"--processes must be 'auto' or a positive integer, not {value!r}", ["processes"]
        )
    return count


def process_node(name: str | None, index: int) -> str:
    """The node name of child INDEX (from 1): ``llm@%h`` → ``llm-2@%h``.

    A name without ``@`` is a host name to Celery (``celery@NAME``)."""
    base, at, host = (name or "celery@%h").rpartition("@")
    if not at:
        base, host = "celery", name or "%h"
    return f"{base}-{index}@{host}"


def node_pattern(node: str) -> str:
    """A regular expression matching NODE and the nodes of its processes."""
    base, at, host = node.rpartition("@")
    if not at:
        return f"^{re.escape(node)}$"
    return f"^{re.escape(base)}(-[0-9]+)?@{re.escape(host)}$"


#: Set in a child's environment: the pid of its supervisor.
PARENT_ENV = "CHORUS_SUPERVISOR_PID"


def die_with_supervisor() -> None:
    """In a child (PARENT_ENV set): get SIGTERM when the supervisor dies
    (Linux), or exit now if it already has."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):
        sys.exit(1)


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen[bytes]
    deaths: deque[float] = field(default_factory=deque)
    done: bool = False


class Supervisor:
    """N worker processes; ``argv(i)`` is the command of child i (from 1).
    Their output goes to OUTPUT (default: the supervisor's own)."""

    def __init__(
        self,
        argv: Callable[[int], Sequence[str]],
        count: int,
        env: Mapping[str, str] | None = None,
        output: IO[bytes] | None = None,
    ) -> None:
        self._argv = argv
        self._count = count
        self._env = {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}
        self._output = output
        self._children: list[_Child] = []
        self.stopping = False

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(self._argv(index)),
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=self._output,
            start_new_session=True,
        )

    def start(self, upto: int | None = None) -> None:
        """Start the children not started yet, up to child UPTO (all by default)."""
        last = self._count if upto is None else min(upto, self._count)
        for index in range(len(self._children) + 1, last + 1):
            self._children.append(_Child(index, self._spawn(index)))

    @property
    def pids(self) -> list[int]:
        """The pids of the running children."""
        return [c.proc.pid for c in self._children if c.proc.poll() is None]

    def check(self) -> int | None:
        """Reap and restart dead children; the supervisor's exit status once
        it must end (every child exited 0, or one crash-looped), else None."""
        for child in self._children:
            code = child.proc.poll()
            if code is None or child.done:
                continue
            if self.stopping or code == 0:
                child.done = True
                continue
            if code < 0:  # killed by a signal: not a configuration failing at start
                log.warning(
                    "worker process %d killed by signal %d: restarting it", child.index, -code
                )
                child.proc = self._spawn(child.index)
                continue
            now = time.monotonic()
            child.deaths.append(now)
            while child.deaths and child.deaths[0] < now - CRASH_WINDOW:
                child.deaths.popleft()
            if len(child.deaths) >= CRASH_LIMIT:
                log.error(
                    "worker process %d exited with %d %d times within %gs: stopping",
                    child.index,
                    code,
                    len(child.deaths),
                    CRASH_WINDOW,
                )
                child.done = True
                return code
            log.warning("worker process %d exited with %d: restarting it", child.index, code)
            child.proc = self._spawn(child.index)
        if all(c.done for c in self._children):
            return 0
        return None

    def signal(self, sig: int) -> None:
        """Send SIG to every running child; after it, no child is restarted."""
        self.stopping = True
        for child in self._children:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(sig)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (a warm shutdown), then SIGKILL what is left after GRACE seconds."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self._children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()

    def run(self) -> int:
        """Start the children and supervise them until they end; the exit status."""
        received: list[int] = []

        def forward(signum: int, _frame: FrameType | None) -> None:
            received.append(signum)

        for sig in FORWARDED:
            signal.signal(sig, forward)
        self.start()
        status: int | None = None
        while status is None:
            time.sleep(POLL)
            while received:
                self.signal(received.pop(0))
            status = self.check()
            if status is not None and not self.stopping:
                self.stop()  # a crash loop: stop the others
        return status
