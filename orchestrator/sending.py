"""What a client sends tasks with: its Celery app and dispatcher, made on
first use, so that a client that only reads never imports Celery."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from orchestrator.engine.actions import Dispatcher
from orchestrator.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

#: Makes each client's Celery app and dispatcher once, whichever of its
#: threads sends first (``functools.cached_property`` has no lock since 3.12).
_MAKING = threading.Lock()


class Sending:
    """The Celery side of :class:`~orchestrator.Client` and
    :class:`~orchestrator.AsyncClient`."""

    settings: Settings
    _celery: Celery | None = None
    _dispatcher: Dispatcher | None = None

    @property
    def celery(self) -> Celery:
        """The Celery app this client sends with (made, and Celery imported,
        on first use: a client that only reads never loads it)."""
        if self._celery is None:
            with _MAKING:
                if self._celery is None:
                    from orchestrator.celery_conf import make_celery

                    self._celery = make_celery(self.settings, main="chorus-client")
        return self._celery

    @property
    def dispatcher(self) -> Dispatcher:
        """What runs the engine's actions: by default, Celery sending them to the fleet."""
        if self._dispatcher is None:
            app = self.celery
            with _MAKING:
                if self._dispatcher is None:
                    from orchestrator.dispatch import CeleryDispatcher

                    self._dispatcher = CeleryDispatcher(app)
        return self._dispatcher

    @dispatcher.setter
    def dispatcher(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    def _close_celery(self) -> None:
        if self._celery is not None:
            self._celery.close()
