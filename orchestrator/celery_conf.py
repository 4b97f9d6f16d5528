"""Celery configuration shared by workers and producers (clients).

The queues and priority steps are plain values: importing them (the
engine, a client) does not import Celery or kombu.

JSON only; acks late; a task whose worker dies is rejected back to the
queue; prefetch 1; every Redis key under the Chorus prefix; ten priority
lists per queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings
from schemas.jobs import MAX_PRIORITY

if TYPE_CHECKING:
    from celery import Celery

#: Queue of each Chorus task (a tool call may name its own queue instead).
QUEUES = {
    "chorus.step": "llm",
    "chorus.tool": "tools",
    "chorus.advance": "control",
    "chorus.sweep": "control",
    "chorus.dequeue": "control",
    "chorus.deadline": "control",
    "chorus.checkpoint": "llm",
}

#: Kombu's Redis transport keeps one list per priority step of a queue and
#: pops the lowest step first; one step per job priority (0-9) keeps them
#: apart. Step 0 is the queue's own list (a message sent without priority).
PRIORITY_STEPS = tuple(range(MAX_PRIORITY + 1))


def broker_priority(priority: int) -> int:
    """Kombu's Redis priority of a job priority: kombu takes step 0 first,
    a job's priority 9 is its highest."""
    return MAX_PRIORITY - priority


def queue_lists(queue: str) -> list[str]:
    """The Redis lists (without the key prefix) holding ``queue``'s waiting
    messages, highest priority first."""
    from kombu.transport.redis import Channel  # loaded by whoever reads the broker

    return [f"{queue}{Channel.sep}{step}" if step else queue for step in PRIORITY_STEPS]


#: The broker transport of a ``redis://`` broker (:mod:`orchestrator.redis_transport`).
REDIS_TRANSPORT = "orchestrator.redis_transport:Transport"


def celery_config(settings: Settings) -> dict[str, Any]:
    broker = settings.broker_url or settings.redis_url
    backend = settings.result_backend or settings.redis_url
    if broker is None or backend is None:
        raise ConfigurationError(
            "no broker: set CHORUS_REDIS_URL (or CHORUS_BROKER_URL and CHORUS_RESULT_BACKEND), "
            "or run `chorus local` for the embedded default"
        )
    prefix = f"{settings.redis_prefix}:"
    # kombu's Redis transport, but one client per channel (not per command)
    transport = {"broker_transport": REDIS_TRANSPORT} if broker.startswith("redis://") else {}
    return {
        **transport,
        "broker_url": broker,
        "result_backend": backend,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": "control",
        "task_routes": {name: {"queue": q} for name, q in QUEUES.items()},
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout,
            "global_keyprefix": prefix,
            "unacked_restore_interval": 10,
            "unacked_restore_throttle": 1,
            "priority_steps": list(PRIORITY_STEPS),
        },
        "result_backend_transport_options": {"global_keyprefix": prefix},
        "result_expires": 24 * 3600,
        # Workers send task events (received, started, succeeded...) for
        # Flower; producers send no "task-sent" event: it doubled the
        # publishes of every send and only showed a task as pending in
        # Flower before a worker received it.
        "worker_send_task_events": True,
        "task_send_sent_event": False,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "beat_schedule": {
            "chorus-sweep": {"task": "chorus.sweep", "schedule": settings.sweep_interval}
        },
    }


def make_celery(settings: Settings, main: str = "chorus") -> Celery:
    """A configured Celery app with no tasks: enough to send by name.
    Celery is imported here, not with this module: a client loads it only
    once it sends something."""
    from celery import Celery

    app = Celery(main, set_as_current=False)
    app.conf.update(celery_config(settings))
    return app
