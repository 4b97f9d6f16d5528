"""What a client sends tasks with: its Celery app and dispatcher, made on
first use, so that a client that only reads never imports Celery."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from orchestrator.engine.actions import Dispatcher
from orchestrator.settings import Settings

if TYPE_CHECKING:
    from celery import Celery


class Sending:
    """The Celery side of :class:`~orchestrator.Client` and
    :class:`~orchestrator.AsyncClient`."""

    settings: Settings

    @cached_property
    def celery(self) -> Celery:
        """The Celery app this client sends with (made, and Celery imported,
        on first use: a client that only reads never loads it)."""
        from orchestrator.celery_conf import make_celery

        return make_celery(self.settings, main="chorus-client")

    @cached_property
    def dispatcher(self) -> Dispatcher:
        """What runs the engine's actions: by default, Celery sending them to the fleet."""
        from orchestrator.dispatch import CeleryDispatcher

        return CeleryDispatcher(self.celery)

    def _close_celery(self) -> None:
        if "celery" in self.__dict__:
            self.celery.close()
