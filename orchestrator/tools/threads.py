"""Helper threads that run tool functions, kept for the next call once done.

A tool runs in a helper thread so that its timeout and a stop of its job
work in every pool: the task waits for the helper with a deadline and
leaves when it passes, while a function that will not return keeps its
thread (a daemon) until it does. Starting a thread a call cost about a
millisecond of CPU on the hot path of a 4-tool step (the new thread's
stack and state, and the start handshake with the task's thread), so a
helper that has finished waits for the next call instead, up to
:data:`MAX_IDLE` of them a process. Each call starts with no context
variables set, as in a new thread, and the helper is named for its tool;
what a tool leaves in its thread (``threading.local`` state, an event loop
it set) may be found by a later call in the same helper, as in any thread
pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import NamedTuple

#: Idle helpers a process keeps; one that finishes with this many idle exits.
MAX_IDLE = 32


class _Job(NamedTuple):
    work: Callable[[], None]
    name: str
    done: threading.Event


_Inbox = queue.SimpleQueue[_Job]

_idle: list[_Inbox] = []
_lock = threading.Lock()


def start(work: Callable[[], None], name: str = "chorus-tool") -> threading.Event:
    """Run ``work`` in a helper thread named ``name``; the event is set once
    it has returned (or raised: ``work`` is expected to catch what it wants
    to keep) and its helper is free for the next call."""
    done = threading.Event()
    job = _Job(work, name, done)
    with _lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        thread = threading.Thread(target=_serve, args=(job, _Inbox()), name=name)
        thread.daemon = True
        thread.start()
    else:
        inbox.put(job)
    return done


def _serve(job: _Job | None, inbox: _Inbox) -> None:
    while job is not None:
        threading.current_thread().name = job.name
        with contextlib.suppress(BaseException):  # ``work`` reports its own outcome
            contextvars.Context().run(job.work)  # as in a new thread: no context variables set
        done = job.done
        job = None  # an idle helper keeps nothing of its last call
        with _lock:
            idle = len(_idle) < MAX_IDLE
            if idle:
                _idle.append(inbox)
        done.set()  # after the helper is idle again: the caller's next call may take it
        if idle:
            job = inbox.get()


def _forget() -> None:
    """A forked child has none of its parent's threads (and maybe a held lock)."""
    global _lock
    _lock = threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_forget)
