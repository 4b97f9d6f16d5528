"""The asyncio client: the operations of :class:`~orchestrator.client.Client`
as coroutines, on native async drivers.

Postgres is reached through SQLAlchemy's asyncio engine on psycopg's async
connections, Redis through ``redis.asyncio``; nothing waits on a thread.
The engine's operations (start a turn, send, cancel, fork...) are the same
functions the blocking client calls (:mod:`orchestrator.client_ops`): they
run inside SQLAlchemy's greenlet bridge (``greenlet_spawn``), where each of
their database statements and Redis commands is awaited on this event loop
(``await_only``). Only handing tasks to Celery (kombu's producer has no
asyncio API: one ``LPUSH`` a task) runs on the default executor.

Many waiters share one live-stream reader and one Postgres checker per
client (:mod:`orchestrator.async_waits`): ten thousand ``await
job.result()`` hold one ``XREAD`` connection, a pool of at most four Redis
connections for short commands, and at most ``db_pool_size +
db_pool_overflow`` Postgres connections, kept open once opened.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import await_only, greenlet_spawn

from orchestrator import client_args as args
from orchestrator import client_ops as ops
from orchestrator import registry, tracing
from orchestrator.async_waits import AsyncStreamReader, AsyncSubscription, AsyncTurnEnds
from orchestrator.engine.actions import Action
from orchestrator.engine.approvals import sent_later_if_broker_down
from orchestrator.engine.turns import JobRef
from orchestrator.errors import ConfigurationError
from orchestrator.events import ENTRY_EVENT, is_cut
from orchestrator.job_reads import (
    CATCH_UP,
    QUIET_POLL,
    QUIET_POLL_MAX,
    STATUS,
    TERMINAL_NAMES,
    Follow,
    JobIds,
    M,
    answer,
    end_entry,
    job_status,
    typed_output,
)
from orchestrator.keys import events_stream
from orchestrator.runtime import Runtime
from orchestrator.sending import Sending
from orchestrator.settings import Settings, load_settings
from orchestrator.store.dialect import url_is_postgres
from schemas import (
    AgentSpec,
    Budget,
    Decision,
    Event,
    JobStatus,
    Message,
    PendingApproval,
    TodoItem,
    Usage,
)
from schemas.jobs import DEFAULT_PRIORITY

#: This client's Postgres connections, by their ``application_name``.
_BACKENDS = text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :name")

P = ParamSpec("P")
T = TypeVar("T")


class _GreenPipeline:
    """A ``redis.asyncio`` pipeline as blocking code sees one: commands
    queue, ``execute`` is awaited on the loop (inside ``greenlet_spawn``)."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    def execute(self, raise_on_error: bool = True) -> Any:
        return await_only(self._pipe.execute(raise_on_error))

    def __getattr__(self, name: str) -> Callable[..., _GreenPipeline]:
        command = getattr(self._pipe, name)

        def queue(*a: Any, **kw: Any) -> _GreenPipeline:
            command(*a, **kw)
            return self

        return queue


class _GreenRedis:
    """A ``redis.asyncio`` client as the engine's blocking code sees one:
    each command is awaited on the loop (inside ``greenlet_spawn``)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client

    def pipeline(self, transaction: bool = True) -> _GreenPipeline:
        return _GreenPipeline(self._client.pipeline(transaction=transaction))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        command = getattr(self._client, name)
        return lambda *a, **kw: await_only(command(*a, **kw))


class _GreenRuntime(Runtime):
    """A runtime whose sessions run on the async engine (``sync_engine``:
    its blocking face, usable inside ``greenlet_spawn``) and whose Redis is
    ``redis.asyncio``."""

    def __init__(self, settings: Settings, engine: AsyncEngine, client: aioredis.Redis) -> None:
        super().__init__(settings)
        self.engine = engine.sync_engine
        self.__dict__["redis"] = _GreenRedis(client)


class AsyncClient(Sending):
    """:class:`~orchestrator.client.Client`'s operations for asyncio
    applications (FastAPI handlers, bots): every method is a coroutine
    (``await client.submit(...)``), and so are :class:`AsyncJob`'s.

    Use it as ``async with AsyncClient() as client:`` or call
    :meth:`close`. It checks its arguments as ``Client`` does and raises the
    same errors. Postgres only (psycopg's async driver); the embedded
    SQLite of ``chorus local`` needs the blocking ``Client``. A client
    belongs to the event loop that first uses it (its connections and
    tasks live there): make one per loop.

    Args:
        settings: defaults to :func:`~orchestrator.settings.load_settings`.
            ``settings.modules`` are imported as by ``Client``.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        if not url_is_postgres(self.settings.db_url):
            raise ConfigurationError("AsyncClient needs Postgres (CHORUS_DATABASE_URL)")
        if self.settings.redis_url is None:
            raise ConfigurationError(
                "CHORUS_REDIS_URL is not set; run `chorus local` for the embedded default"
            )
        registry.load_modules(self.settings.modules)
        #: The name its connections carry (``application_name``, ``CLIENT SETNAME``).
        self.name = f"chorus-async-client-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.engine = create_async_engine(
            self.settings.db_url,
            connect_args={"application_name": self.name},
            # every connection it may open is kept: a burst of waiters reading
            # their status closed and reopened overflow ones by the thousand
            pool_size=self.settings.db_pool_size + self.settings.db_pool_overflow,
            max_overflow=0,
            pool_use_lifo=True,
        )
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.redis = aioredis.Redis.from_url(
            self.settings.redis_url, decode_responses=True, client_name=self.name
        )
        self.runtime = _GreenRuntime(self.settings, self.engine, self.redis)
        self.streams = AsyncStreamReader(self.settings.redis_url, self.name)
        self.ends = AsyncTurnEnds(self.engine)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the shared reader and checker, close every connection."""
        await self.streams.close()
        await self.ends.close()
        await self.redis.aclose()
        await self.engine.dispose()
        self._close_celery()

    async def _run(self, fn: Callable[P, T], *a: P.args, **kw: P.kwargs) -> T:
        """Run a blocking operation of :mod:`orchestrator.client_ops` with
        its statements and commands awaited on this loop."""
        result: T = await greenlet_spawn(partial(fn, *a, **kw))
        return result

    async def _send(self, actions: list[Action], trace: tracing.JobTrace | None = None) -> None:
        if actions:
            await asyncio.get_running_loop().run_in_executor(None, self._send_now, actions, trace)

    def _send_now(self, actions: list[Action], trace: tracing.JobTrace | None) -> None:
        # in the executor's thread: the trace is set where the tasks are sent
        with tracing.sending(trace):
            self.dispatcher.send(actions)

    async def submit(
        self,
        agent: str | AgentSpec,
        input: str,
        *,
        conversation_id: str | None = None,
        context_data: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        budget: Budget | None = None,
        priority: int = DEFAULT_PRIORITY,
        trace_parent: str | None = None,
        tenant: str | None = None,
    ) -> AsyncJob:
        """Start a turn: as :meth:`Client.submit <orchestrator.client.Client.submit>`
        (``trace_parent`` and ``tenant`` included: by default the current
        OpenTelemetry span of the calling task, if any)."""
        trace = tracing.submitted(trace_parent)
        options = (conversation_id, context_data, idempotency_key, budget, priority, tenant)
        request = args.job_request(agent, input, *options)
        ref, actions = await self._run(ops.submit, self.runtime, request)
        await self._send(actions, trace)
        return AsyncJob(self, ref)

    async def job(self, job_id: str) -> AsyncJob:
        """A handle on an existing job."""
        return AsyncJob(self, await self._run(ops.job, self.runtime, job_id))

    async def send(
        self,
        conversation_id: str,
        text: str,
        *,
        context_data: dict[str, Any] | None = None,
        budget: Budget | None = None,
        priority: int | None = None,
    ) -> str:
        """Send a message to a conversation; its queue entry id (see ``Client.send``)."""
        options = args.message_options(context_data, budget, priority)
        entry, actions = await self._run(ops.send, self.runtime, conversation_id, text, options)
        await self._send(actions)
        return entry

    async def job_for_message(self, conversation_id: str, entry_id: str) -> AsyncJob | None:
        """The job a sent message started, or None while it still waits."""
        ref = await self._run(ops.job_for_message, self.runtime, conversation_id, entry_id)
        return AsyncJob(self, ref) if ref else None

    async def clear_queue(self, conversation_id: str) -> int:
        """Drop the conversation's queued messages; how many."""
        return await self._run(ops.clear_queue, self.runtime, conversation_id)

    async def cancel(self, job_id: str) -> None:
        """Cancel a job and every subagent under it (see ``Client.cancel``)."""
        revoke, actions = await self._run(ops.stop, self.runtime, job_id)
        if revoke:
            await asyncio.get_running_loop().run_in_executor(None, self.dispatcher.revoke, revoke)
        await self._send(actions)

    async def checkpoint(self, conversation_id: str) -> None:
        """Summarize the conversation in the background (see ``Client.checkpoint``)."""
        await self._send(await self._run(ops.checkpoint, self.runtime, conversation_id))

    async def fork(self, conversation_id: str, *, tenant: str | None = None) -> str:
        """A new conversation with a copy of this one's messages; its id
        (``tenant`` as in ``Client.fork``)."""
        return await self._run(ops.fork, self.runtime, conversation_id, tenant)

    async def clear(self, conversation_id: str) -> int:
        """Delete the conversation's messages and plan; how many messages."""
        return await self._run(ops.clear, self.runtime, conversation_id)

    async def load(
        self, conversation_id: str, messages: list[Message] | list[dict[str, Any]]
    ) -> int:
        """Replace the conversation's history with ``messages`` (validated)."""
        return await self._run(ops.load, self.runtime, conversation_id, messages)

    async def usage(self, conversation_id: str) -> Usage:
        """Tokens and cost of every model call of the conversation."""
        return await self._run(ops.usage, self.runtime, conversation_id)

    async def plan(self, conversation_id: str) -> list[TodoItem]:
        """The conversation's plan (empty before its first)."""
        return await self._run(ops.plan, self.runtime, conversation_id)

    async def history(self, conversation_id: str) -> list[Message]:
        """Every stored message of the conversation, oldest first."""
        return await self._run(ops.history, self.runtime, conversation_id)

    async def tool_output(self, conversation_id: str, handle: str) -> Any:
        """The whole archived result of a tool call (see ``Client.tool_output``)."""
        return await self._run(ops.tool_output, self.runtime, conversation_id, handle)

    async def approve(
        self, call_id: str, *, note: str | None = None, by: str | None = None
    ) -> bool:
        """Approve a tool call waiting for a person's answer: as
        :meth:`Client.approve <orchestrator.client.Client.approve>` (a second
        answer raises :class:`~orchestrator.errors.ConflictError`)."""
        return await self._answer(call_id, Decision.APPROVED, by, note)

    async def deny(self, call_id: str, *, reason: str, by: str | None = None) -> bool:
        """Deny a tool call waiting for a person's answer: as
        :meth:`Client.deny <orchestrator.client.Client.deny>`."""
        return await self._answer(call_id, Decision.DENIED, by, reason)

    async def _answer(
        self, call_id: str, decision: Decision, by: str | None, text: str | None
    ) -> bool:
        actions = await self._run(ops.answer, self.runtime, call_id, decision, by, text)
        with sent_later_if_broker_down(call_id) as delivery:
            await self._send(actions)
        return delivery.sent

    async def pending_approvals(
        self,
        *,
        conversation_id: str | None = None,
        agent: str | None = None,
        tool: str | None = None,
        tenant: str | None = None,
    ) -> list[PendingApproval]:
        """The tool calls waiting for a person's answer, oldest first, filtered
        as :meth:`Client.pending_approvals <orchestrator.client.Client.pending_approvals>`."""
        return await self._run(
            ops.pending_approvals, self.runtime, conversation_id, agent, tool, tenant
        )

    async def connections(self) -> dict[str, int]:
        """Connections this client holds open now, as the servers count
        them: Postgres's ``pg_stat_activity`` and Redis's ``CLIENT LIST``
        rows carrying its name (:attr:`name`)."""
        listed: Any = await self.redis.client_list()
        async with self._autocommit.connect() as connection:
            postgres = await connection.scalar(_BACKENDS, {"name": self.name})
        return {
            "postgres": int(postgres or 0),
            "redis": sum(1 for c in listed if c.get("name") == self.name),
        }


class AsyncJob:
    """One submitted turn: its status, live events and result, awaited."""

    def __init__(self, client: AsyncClient, ref: JobRef) -> None:
        self._client = client
        self.id = ref.job_id
        self.conversation_id = ref.conversation_id
        self.root_id = ref.root_id
        self._ids = JobIds(ref.job_id, ref.conversation_id, ref.root_id)

    def __repr__(self) -> str:
        return f"AsyncJob({self.id!r}, conversation={self.conversation_id!r})"

    async def cancel(self) -> None:
        """Cancel this job and its subagents."""
        await self._client.cancel(self.id)

    async def plan(self) -> list[TodoItem]:
        """The plan of this job's conversation."""
        return await self._client.plan(self.conversation_id)

    async def status(self) -> JobStatus:
        """Where the job stands (see ``Job.status``)."""
        async with self._client._autocommit.connect() as connection:
            row = (await connection.execute(STATUS, {"id": self.id})).one()
            return job_status(row)

    async def result(self, timeout: float | None = None) -> str:
        """Wait for the turn to end; the final answer. Raises
        :class:`TimeoutError` after ``timeout`` seconds and
        :class:`~orchestrator.errors.JobFailedError` if the turn failed or
        was cancelled."""
        return answer(self.id, await _wait_end(self, _Deadline(self.id, args.timeout(timeout))))

    async def output(
        self, model: type[M] | None = None, *, timeout: float | None = None
    ) -> M | Any:
        """Wait for the turn to end; its structured answer, typed as
        ``Job.output`` returns it (the agent's ``output`` model, ``model``,
        or the validated JSON in a process that did not declare the agent)."""
        await self.result(timeout)
        return typed_output(await self.status(), model)

    def events(
        self, since: int | None = None, *, timeout: float | None = None, deltas: bool = True
    ) -> AsyncIterator[Event]:
        """The job's events in order, live, until its turn ends (``async
        for``): stored ones from Postgres, then the root's Redis stream,
        no gap and none twice, as ``Job.events``."""
        return _follow(
            self,
            args.since(since),
            _Deadline(self.id, args.timeout(timeout)),
            args.flag(deltas, "deltas"),
        )


class _Deadline:
    def __init__(self, job_id: str, timeout: float | None) -> None:
        self.job_id = job_id
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self, poll: float) -> float:
        """Seconds left (unbounded: ``poll``); raises TimeoutError when spent."""
        if self.at is None:
            return poll
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"job {self.job_id} did not finish within {self.timeout}s")
        return min(poll, left)


def _stream(job: AsyncJob) -> str:
    return events_stream(job._client.settings.redis_prefix, job.root_id)


async def _wait_end(job: AsyncJob, deadline: _Deadline) -> JobStatus | Event:
    """As the blocking client's: the shared reader wakes this waiter on the
    turn's terminal event; the shared checker when Postgres shows it ended."""
    client = job._client
    async with client.streams.subscribe(_stream(job), TERMINAL_NAMES) as subscription:
        with client.ends.watch(job.id, subscription.wake):
            while True:
                status = await job.status()
                if status.status.finished:
                    return status
                while True:
                    entries = await subscription.wait(deadline.remaining(QUIET_POLL_MAX))
                    if not entries:
                        break
                    for _, fields in entries:
                        event = end_entry(job._ids, fields)
                        if event is not None:  # a cut one has no output: ask Postgres
                            return await job.status() if is_cut(fields) else event


async def _live(
    subscription: AsyncSubscription, deadline: _Deadline, poll: float
) -> list[Event] | None:
    entries = await subscription.wait(deadline.remaining(poll))
    if not entries:
        return None
    return [Event.model_validate_json(fields[ENTRY_EVENT]) for _, fields in entries]


async def _follow(
    job: AsyncJob, last: int, deadline: _Deadline, deltas: bool
) -> AsyncIterator[Event]:
    """The blocking client's follower, its reads awaited (see ``client._follow``)."""
    client = job._client
    run = client._run
    rt = client.runtime
    async with client.streams.subscribe(_stream(job)) as subscription:
        correlation_id, held = await run(ops.follow_start, rt, job.id, deltas)
        follow = Follow(job._ids, correlation_id, last, held, deltas)
        read = partial(ops.stored, rt, job.root_id, correlation_id)
        stale, poll, catch_up = True, QUIET_POLL, CATCH_UP
        while True:
            if stale:
                stored = await run(read, follow.last, held)
                events, ended = follow.stored(stored)
                for event in events:
                    yield event
                if ended:
                    return
                if not stored and (await job.status()).status.finished:
                    # its end is at or before ``since``: wait until every
                    # transaction older than now has ended, read the rest
                    horizon = await run(ops.horizon, rt)
                    pause = CATCH_UP
                    while horizon is not None and await run(ops.bound, rt) < horizon:
                        await asyncio.sleep(deadline.remaining(pause))
                        pause = min(QUIET_POLL, pause * 2)
                    for event in follow.rest(await run(read, follow.last, held)):
                        yield event
                    return
            behind = follow.behind()
            if behind:
                wait, catch_up = catch_up, min(QUIET_POLL, catch_up * 2)
            else:
                wait, catch_up = poll, CATCH_UP
            live = await _live(subscription, deadline, wait)
            if live is None and not behind:
                poll = min(QUIET_POLL_MAX, poll * 2)
            elif live is not None:
                poll = QUIET_POLL
            due, announced = follow.live(live or [])
            for event in due:
                yield event
            stale = live is None or behind or announced
