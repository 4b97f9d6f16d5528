"""A worker's background chore: a daemon thread that runs it now and every
few seconds until stopped; a failure is logged and tried again next time
(Redis or Postgres may be away for a moment; the thread must not die)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Self

log = logging.getLogger(__name__)


class Periodic:
    """``work`` now and every ``every`` seconds, from a daemon thread named
    ``name``, until :meth:`stop`; a failure is logged as ``failing``."""

    def __init__(self, name: str, every: float, work: Callable[[], object], failing: str) -> None:
        self.every = every
        self._work, self._failing = work, failing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.once()
            if self._stop.wait(self.every):
                return

    def once(self) -> None:
        """``work`` once, here (a failure logged)."""
        try:
            self._work()
        except Exception:
            log.warning(self._failing, exc_info=True)

    def stop(self) -> None:
        """End the thread (waiting up to 5 s for a run under way)."""
        self._stop.set()
        self._thread.join(5)
