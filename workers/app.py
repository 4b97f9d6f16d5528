"""The worker's Celery app: configuration, tasks and the declared modules."""

from __future__ import annotations

import gc
from typing import Any

from celery import Celery
from celery._state import _set_task_join_will_block
from celery.signals import (
    after_task_publish,
    beat_init,
    celeryd_after_setup,
    setup_logging,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from orchestrator import published, registry, tracing
from orchestrator.celery_conf import QUEUES, make_celery
from orchestrator.liveness import start_heartbeat, touch
from orchestrator.llm.call import warm
from orchestrator.logs import setup_logging as configure_logging
from orchestrator.periodic import Periodic
from orchestrator.readers import Announcer
from orchestrator.runtime import Runtime
from orchestrator.settings import Settings, load_settings
from orchestrator.store.db import forget_engines
from orchestrator.tools import toolsets
from workers.tasks import register_tasks


def _forget_inherited_engines(**_: Any) -> None:
    """A forked child opens its own database connections."""
    forget_engines()


def no_result_subscriptions(**_: Any) -> None:
    """Tasks never wait on results (state lives in Postgres), so the Redis
    backend need not SUBSCRIBE to every chord part a worker sends. Prefork
    already works this way; threads and gevent pools would otherwise keep
    one subscription per dispatched tool call."""
    _set_task_join_will_block(True)


def prepare_worker(instance: Any = None, **_: Any) -> None:
    """Before a worker consumes (``celeryd_after_setup``: logging is set
    up, the pool not started, so prefork children inherit this):

    - a worker that takes model calls loads the model client, so the calls
      it admits under a rate limit are sent at once, not after seconds of
      first imports; with MCP servers declared, every worker loads the MCP
      client (discovery runs in steps, calls in tool tasks);
    - the heap built at startup (litellm alone is ~400k objects) is frozen
      out of the garbage collector (:func:`startup_done`): a full collection
      over it stops every thread of the process for most of a second,
      between admitting calls and sending them, whether the loading
      succeeded or not (Celery logs a failure and the worker runs on: the
      collector must not stay off for its lifetime).
    """
    try:
        selected = instance.app.amqp.queues.consume_from if instance is not None else None
        if not selected or QUEUES["chorus.step"] in selected:
            warm()
        if registry.toolset_names():
            toolsets.load_client()
    finally:
        startup_done()


def startup_done(**_: Any) -> None:
    """Freeze the heap built at startup and turn the garbage collector back
    on: ``chorus worker`` and ``chorus beat`` turn it off before their first
    imports, which otherwise run a collection every few hundred objects they
    create (a quarter of litellm's import time)."""
    gc.collect()
    gc.freeze()
    gc.enable()


def announce_queues(settings: Settings) -> tuple[Any, Any]:
    """Signal handlers announcing the queues a worker reads while it runs
    (:mod:`orchestrator.readers`), from its main process, on a runtime of
    their own (a prefork child never uses its connection); when it is
    ready, it also publishes its registrations and marks them while it runs
    (:mod:`orchestrator.published`)."""
    announcers: list[Periodic] = []

    def ready(sender: Any = None, **_: Any) -> None:
        queues = list(sender.app.amqp.queues.consume_from)
        rt = Runtime(settings)
        # what clients validate agent names against, while this worker runs
        announcers.append(published.Publisher(rt).start())
        announcers.append(Announcer(rt, sender.hostname, queues).start())

    def shutdown(**_: Any) -> None:
        while announcers:
            announcers.pop().stop()

    return ready, shutdown


def create_app(settings: Settings | None = None) -> Celery:
    """A Celery app with the Chorus tasks, importing ``settings.modules``."""
    settings = settings or load_settings()
    registry.load_modules(settings.modules)
    app = make_celery(settings)
    register_tasks(app, Runtime(settings))
    worker_process_init.connect(_forget_inherited_engines, weak=False)
    celeryd_after_setup.connect(prepare_worker, weak=False)
    worker_ready.connect(no_result_subscriptions, weak=False)
    ready, shutdown = announce_queues(settings)
    worker_ready.connect(ready, weak=False)
    worker_shutdown.connect(shutdown, weak=False)

    # Liveness (``chorus alive``): a worker's node shows that it runs,
    # without Redis; beat shows that it sends (orchestrator/liveness.py).
    def _worker_heartbeat(sender: Any = None, **_: Any) -> None:
        start_heartbeat(settings.state_dir, str(sender))

    def _beat_sent(**_: Any) -> None:
        touch(settings.state_dir, "beat")

    def _beat_heartbeat(**_: Any) -> None:
        touch(settings.state_dir, "beat")  # started: its first sweep is due
        after_task_publish.connect(_beat_sent, weak=False)

    celeryd_after_setup.connect(_worker_heartbeat, weak=False)
    beat_init.connect(_beat_heartbeat, weak=False)
    beat_init.connect(startup_done, weak=False)

    def _logging(loglevel: str | int | None = None, **_: Any) -> None:
        # Connecting this signal tells Celery to leave logging to us.
        configure_logging(loglevel or settings.log_level, settings.log_format)

    setup_logging.connect(_logging, weak=False)
    if tracing.enabled():
        trace_tasks()
    return app


def trace_tasks() -> None:
    """Traces on (``OTEL_EXPORTER_OTLP_ENDPOINT`` set, :mod:`orchestrator.tracing`):
    tasks pass their job's trace on, and each process that runs tasks builds
    its exporter once it runs (a prefork child after the fork) and sends its
    batched spans before it exits."""
    tracing.propagate()

    def _start(**_: Any) -> None:
        tracing.start()

    def _flush(**_: Any) -> None:
        tracing.flush()

    worker_process_init.connect(_start, weak=False)
    worker_ready.connect(_start, weak=False)
    worker_process_shutdown.connect(_flush, weak=False)
    worker_shutdown.connect(_flush, weak=False)
