"""The Python client: submit jobs, follow their events, read results."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator import client_args as args
from orchestrator import client_ops as ops
from orchestrator import registry, tracing
from orchestrator.engine.actions import Dispatcher
from orchestrator.engine.approvals import sent_later_if_broker_down
from orchestrator.engine.turns import JobRef
from orchestrator.errors import (
    ConfigurationError,
)
from orchestrator.events import ENTRY_EVENT, is_cut
from orchestrator.job_reads import (
    CATCH_UP,
    QUIET_POLL,
    QUIET_POLL_MAX,
    STATUS,
    TERMINAL_NAMES,
    Follow,
    HeldDeltas,
    JobIds,
    M,
    Unsettled,
    answer,
    end_entry,
    job_status,
    settle,
    typed_output,
    within,
)
from orchestrator.keys import events_stream
from orchestrator.lazy import made_once
from orchestrator.runtime import Runtime
from orchestrator.sending import Sending
from orchestrator.settings import Settings, load_settings
from orchestrator.streams import StreamReader, Subscription
from orchestrator.turn_ends import TurnEnds
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

#: Re-exported: the limits every method of both clients checks.
MAX_ID_CHARS = args.MAX_ID_CHARS
MAX_SEQ = args.MAX_SEQ
_id = args.valid_id
_known = args.conversation
_timeout = args.timeout
_since = args.since


class Client(Sending):
    """Talks to the fleet through Redis (tasks, live events) and Postgres (state).

    Every method of it and of its :class:`Job` checks its arguments as
    ``submit`` does: an id that is not a storable string of 1 to
    :data:`MAX_ID_CHARS` characters, a ``since`` outside 0 to
    :data:`MAX_SEQ`, a negative or NaN ``timeout`` raise
    :class:`~orchestrator.errors.InvalidRequestError` naming the field.

    Args:
        settings: defaults to :func:`~orchestrator.settings.load_settings`
            (or ``runtime``'s). ``settings.modules`` are imported so that the
            client knows which agents and tools the workers registered.
        runtime: the connections and model client to use; by default built
            from ``settings``.
        dispatcher: what runs the engine's actions; by default Celery, sending
            them to the fleet (:mod:`orchestrator.testing` runs them inline).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        runtime: Runtime | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.settings = settings or (runtime.settings if runtime is not None else load_settings())
        registry.load_modules(self.settings.modules)
        self.runtime = runtime if runtime is not None else Runtime(self.settings)
        if dispatcher is not None:
            self.dispatcher = dispatcher

    @made_once
    def ends(self) -> TurnEnds:
        """The one checker in Postgres of the turns this client's waiters wait for."""
        return TurnEnds(self.runtime)

    @made_once
    def streams(self) -> StreamReader:
        """The one reader of live event streams shared by this client's waiters."""
        if self.settings.redis_url is None:
            raise ConfigurationError(
                "CHORUS_REDIS_URL is not set; run `chorus local` for the embedded default"
            )
        return StreamReader(self.settings.redis_url)

    def submit(
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
    ) -> Job:
        """Start a turn: run ``agent`` on ``input``.

        Continues ``conversation_id`` with its whole history when given. A
        second submit with the same ``idempotency_key`` returns the first
        job. ``priority`` (0 to 9, default 5; higher first) goes with every
        task of the job and its subagents: workers take waiting tasks of a
        higher priority first, so an interactive job overtakes a backlog of
        batch jobs (one already running is not interrupted). Raises
        :class:`~orchestrator.errors.UnknownAgentError`,
        :class:`~orchestrator.errors.UnknownToolError` or
        :class:`~orchestrator.errors.InvalidRequestError` at once.

        ``trace_parent`` (a W3C ``traceparent``, such as an HTTP request's)
        makes the job's trace part of that trace; by default the caller's
        current OpenTelemetry span, if any (README, "Tracing").

        ``tenant`` gives the new conversation to that tenant of the HTTP API
        (its tokens see the job; ``chorus server`` passes its token's), in
        the transaction that stores the job; a job that continues
        ``conversation_id`` belongs to that conversation's root's tenant and
        takes none (:class:`~orchestrator.errors.InvalidRequestError`).
        """
        trace = tracing.submitted(trace_parent)
        options = (conversation_id, context_data, idempotency_key, budget, priority, tenant)
        request = args.job_request(agent, input, *options)
        ref, actions = ops.submit(self.runtime, request)
        with tracing.sending(trace):
            self.dispatcher.send(actions)
        return Job(self, ref)

    def job(self, job_id: str) -> Job:
        """A handle on an existing job."""
        return Job(self, ops.job(self.runtime, job_id))

    def send(
        self,
        conversation_id: str,
        text: str,
        *,
        context_data: dict[str, Any] | None = None,
        budget: Budget | None = None,
        priority: int | None = None,
    ) -> str:
        """Send a message to a conversation; returns its queue entry id.

        An idle conversation starts a turn on it at once; a busy one keeps it
        in its Redis queue (``message.queued``) until the running turn ends,
        then starts a turn per message, in order (``message.dequeued``).
        :meth:`job_for_message` finds the job a message started. The turn
        runs with the ``context_data``, budget and priority of the
        conversation's last job (read when it starts), each unless given
        here.
        """
        options = args.message_options(context_data, budget, priority)
        entry, actions = ops.send(self.runtime, conversation_id, text, options)
        self.dispatcher.send(actions)
        return entry

    def job_for_message(self, conversation_id: str, entry_id: str) -> Job | None:
        """The job a sent message started, or None while it still waits."""
        ref = ops.job_for_message(self.runtime, conversation_id, entry_id)
        return Job(self, ref) if ref else None

    def clear_queue(self, conversation_id: str) -> int:
        """Drop the conversation's queued messages (``queue.cleared``); returns how many."""
        return ops.clear_queue(self.runtime, conversation_id)

    def cancel(self, job_id: str) -> None:
        """Cancel a job and every subagent under it; safe on a finished job.

        The job is first marked stopping in Postgres (its steps, tool calls
        and advances then leave), then in-flight model calls stop at their
        next streamed chunk and running tool tasks within half a second (the
        function itself runs out in a background thread; its result is
        discarded), queued tool tasks are revoked, unfinished tool calls are
        recorded cancelled, and every conversation of the tree goes idle
        (``turn.cancelled``). If this process dies midway, the sweeper
        finishes the stop. Raises
        :class:`~orchestrator.errors.ServiceUnavailableError` if Postgres or
        Redis keep failing.
        """
        revoke, actions = ops.stop(self.runtime, job_id)
        if revoke:
            self.dispatcher.revoke(revoke)
        self.dispatcher.send(actions)

    def checkpoint(self, conversation_id: str) -> None:
        """Summarize the conversation in the background (``checkpoint.started|completed``):
        later prompts hold the summary instead of the messages before it."""
        self.dispatcher.send(ops.checkpoint(self.runtime, conversation_id))

    def fork(self, conversation_id: str, *, tenant: str | None = None) -> str:
        """A new conversation with a copy of this one's messages; returns its
        id. ``tenant``: the HTTP API tenant the copy belongs to, stored with it."""
        return ops.fork(self.runtime, conversation_id, tenant)

    def clear(self, conversation_id: str) -> int:
        """Delete the conversation's messages and its plan; returns how many messages."""
        return ops.clear(self.runtime, conversation_id)

    def load(self, conversation_id: str, messages: list[Message] | list[dict[str, Any]]) -> int:
        """Replace the conversation's history with ``messages`` (validated);
        its plan is dropped."""
        return ops.load(self.runtime, conversation_id, messages)

    def usage(self, conversation_id: str) -> Usage:
        """Tokens and cost of every model call of the conversation."""
        return ops.usage(self.runtime, conversation_id)

    def plan(self, conversation_id: str) -> list[TodoItem]:
        """The conversation's plan, as its agent last wrote it with
        ``manage_todo_list`` (``plan.updated``); empty before the first."""
        return ops.plan(self.runtime, conversation_id)

    def history(self, conversation_id: str) -> list[Message]:
        """Every stored message of the conversation, oldest first."""
        return ops.history(self.runtime, conversation_id)

    def tool_output(self, conversation_id: str, handle: str) -> Any:
        """The whole result of a tool call whose output passed its agent's
        ``tool_output_limit`` (the model saw a view of it), by the handle in
        that view and in the call's ``tool.completed`` event; the call must
        be in this conversation's tree (its root, or any subagent of it)."""
        return ops.tool_output(self.runtime, conversation_id, handle)

    def approve(self, call_id: str, *, note: str | None = None, by: str | None = None) -> bool:
        """Approve a tool call waiting for a person's answer: it runs, and its
        turn goes on. ``by`` names who answered in ``tool.approved`` (default:
        this process's user). The answer is stored in Postgres before the
        call is sent (the sweeper re-sends it if this process dies); if
        Redis does not answer, the answer still stands and this returns
        False (True: sent now): the sweeper sends the call once Redis is
        back. Raises
        :class:`~orchestrator.errors.ApprovalNotFound` for an unknown call
        and :class:`~orchestrator.errors.ConflictError` for one already
        answered (the first answer stands) or no longer waiting."""
        return self._answer(call_id, Decision.APPROVED, by, note)

    def deny(self, call_id: str, *, reason: str, by: str | None = None) -> bool:
        """Deny a tool call waiting for a person's answer: it never runs, and
        the model gets an error result with ``reason`` (``tool.denied``).
        Raises as :meth:`approve`."""
        return self._answer(call_id, Decision.DENIED, by, reason)

    def _answer(self, call_id: str, decision: Decision, by: str | None, text: str | None) -> bool:
        actions = ops.answer(self.runtime, call_id, decision, by, text)
        with sent_later_if_broker_down(call_id) as delivery:
            self.dispatcher.send(actions)
        return delivery.sent

    def pending_approvals(
        self,
        *,
        conversation_id: str | None = None,
        agent: str | None = None,
        tool: str | None = None,
        tenant: str | None = None,
    ) -> list[PendingApproval]:
        """The tool calls waiting for a person's answer, oldest first:
        those of ``conversation_id`` (or of the tree it is the root of), of
        conversations running ``agent``, of ``tool``, of jobs submitted by
        ``tenant``'s HTTP tokens, when given."""
        return ops.pending_approvals(self.runtime, conversation_id, agent, tool, tenant)

    def close(self) -> None:
        if "streams" in self.__dict__:
            self.streams.close()
        if "ends" in self.__dict__:
            self.ends.close()
        self._close_celery()


class Job:
    """One submitted turn: its status, live events and result."""

    def __init__(self, client: Client, ref: JobRef) -> None:
        self._client = client
        self.id = ref.job_id
        self.conversation_id = ref.conversation_id
        self.root_id = ref.root_id

    def __repr__(self) -> str:
        return f"Job({self.id!r}, conversation={self.conversation_id!r})"

    def cancel(self) -> None:
        """Cancel this job and its subagents (see :meth:`Client.cancel`)."""
        self._client.cancel(self.id)

    def plan(self) -> list[TodoItem]:
        """The plan of this job's conversation (see :meth:`Client.plan`)."""
        return self._client.plan(self.conversation_id)

    def status(self) -> JobStatus:
        """Where the job stands; ``agent`` is the agent holding its turn (the
        last handoff's target, once its agent handed off)."""
        with self._client.runtime.autocommit() as connection:
            return job_status(connection.execute(STATUS, {"id": self.id}).one())

    def result(self, timeout: float | None = None) -> str:
        """Wait for the turn to end; return the final answer.

        Raises :class:`TimeoutError` after ``timeout`` seconds and
        :class:`~orchestrator.errors.JobFailedError` if the turn failed or
        was cancelled.
        """
        return answer(self.id, _wait_end(self, _timeout(timeout)))

    def output(self, model: type[M] | None = None, *, timeout: float | None = None) -> M | Any:
        """Wait for the turn to end (as :meth:`result`); return its
        structured answer, an instance of the agent's ``output`` model.

        ``model`` validates it into that class; without it, the class the
        agent was declared with in this process is used, and a process that
        did not declare the agent gets the validated JSON (a dict). Raises
        :class:`~orchestrator.errors.NoStructuredOutputError` if the agent
        declares no output, besides :meth:`result`'s errors."""
        self.result(timeout)
        return typed_output(self.status(), model)

    def events(
        self,
        since: int | None = None,
        *,
        timeout: float | None = None,
        deltas: bool = True,
        settle_within: float | None = None,
    ) -> Iterator[Event]:
        """Yield the job's events in order, live, until its turn ends.

        Stored events come from Postgres, then the root's Redis Stream feeds
        new ones; any gap is filled from Postgres. ``since`` resumes after
        that sequence number. ``assistant.delta`` events (live only) are
        included unless ``deltas`` is False.

        Once the turn has ended, its last events are read when the
        transactions older than them have ended. ``settle_within`` bounds
        that wait (one held open elsewhere would hold it forever): past it
        the events readable then are yielded and the iteration ends, perhaps
        without the terminal one (None: as long as ``timeout`` allows).
        """
        return _follow(
            self,
            _since(since),
            _timeout(timeout),
            args.flag(deltas, "deltas"),
            _timeout(settle_within, "settle_within"),
        )


def _ids(job: Job) -> JobIds:
    return JobIds(job.id, job.conversation_id, job.root_id)


def _stored(job: Job, correlation_id: str, after: int, held: HeldDeltas) -> list[Event]:
    return ops.stored(job._client.runtime, job.root_id, correlation_id, after, held)


def _rest(
    job: Job, correlation_id: str, after: int, waiter: _Waiter, held: HeldDeltas
) -> list[Event]:
    """Every stored event after ``after`` that committed before this call:
    waits (within the waiter's timeout) until the transactions older than
    them have all ended."""
    with job._client.runtime.session() as session, contextlib.suppress(Unsettled):
        settle(session, waiter.settling())
    return _stored(job, correlation_id, after, held)


class _Waiter:
    """The shared stream reader's wake-ups for one job, with its deadline."""

    def __init__(self, job: Job, timeout: float | None, settle_within: float | None = None) -> None:
        self.job = job
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.settle_within = settle_within
        self.poll = QUIET_POLL
        self.catch_up = CATCH_UP

    def remaining(self, poll: float) -> float:
        """Seconds left (unbounded: ``poll``); raises TimeoutError when spent."""
        if self.deadline is None:
            return poll
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"job {self.job.id} did not finish within {self.timeout}s")
        return min(poll, left)

    def settling(self) -> Callable[[float], float]:
        """The pauses of a wait for older transactions starting now: within
        the timeout, and ``settle_within`` (then :class:`Unsettled`)."""
        if self.settle_within is None:
            return self.remaining
        return within(self.settle_within, self.remaining)

    def wait(self, subscription: Subscription, behind: bool = False) -> list[Event] | None:
        """Live events of the job's tree, or None after a quiet period (the
        caller then reads Postgres; the next quiet period is longer).
        ``behind``: an event announced live is not readable yet, so the
        period is short (and grows while that lasts)."""
        if behind:
            poll, self.catch_up = self.catch_up, min(QUIET_POLL, self.catch_up * 2)
        else:
            poll, self.catch_up = self.poll, CATCH_UP
        entries = subscription.wait(self.remaining(poll))
        if not entries:
            if not behind:
                self.poll = min(QUIET_POLL_MAX, self.poll * 2)
            return None
        self.poll = QUIET_POLL
        return [Event.model_validate_json(fields[ENTRY_EVENT]) for _, fields in entries]


def _wait_end(job: Job, timeout: float | None) -> JobStatus | Event:
    """Wait for the turn to end: the shared reader wakes this waiter on the
    turn's terminal event (only terminal entries reach it, and only those
    are parsed), which is returned; the client's :class:`TurnEnds` wakes it
    when Postgres shows the turn finished (a publish was lost), and the
    job's status is read then. Should that checker be down, the waiter
    reads it itself after ``QUIET_POLL_MAX`` quiet seconds."""
    waiter = _Waiter(job, timeout)
    client = job._client
    with (
        client.streams.subscribe(_stream(job), TERMINAL_NAMES) as subscription,
        client.ends.watch(job.id, subscription.wake),
    ):
        while True:
            status = job.status()
            if status.status.finished:
                return status
            while True:
                entries = subscription.wait(waiter.remaining(QUIET_POLL_MAX))
                if not entries:
                    break
                for _, fields in entries:
                    event = end_entry(_ids(job), fields)
                    if event is not None:  # a cut one has no output: ask Postgres
                        return job.status() if is_cut(fields) else event


def follow_until(
    job: Job, since: int, deltas: bool, stop: threading.Event, settle_within: float
) -> Iterator[Event]:
    """``job.events(since, deltas=deltas, settle_within=settle_within)`` that
    also ends at its next quiet period (at most ``QUIET_POLL_MAX`` seconds)
    once ``stop`` is set: the HTTP server follows a job in a thread this
    way, so a follower whose client left ends even while the job is quiet
    (waiting for a person)."""
    return _follow(job, _since(since), None, args.flag(deltas, "deltas"), settle_within, stop)


def _follow(
    job: Job,
    last: int,
    timeout: float | None,
    deltas: bool,
    settle_within: float | None = None,
    stop: threading.Event | None = None,
) -> Iterator[Event]:
    """Postgres is read for every stored event, so order and completeness
    never depend on Redis; the stream wakes the follower and carries deltas.

    Ends with the turn's terminal event, or, when that event is at or
    before ``since`` (a follower resuming a finished turn), as soon as
    Postgres shows the turn finished; or after a quiet period once ``stop``
    is set.
    """
    waiter = _Waiter(job, timeout, settle_within)
    with job._client.streams.subscribe(_stream(job)) as subscription:
        correlation_id, held = ops.follow_start(job._client.runtime, job.id, deltas)
        follow = Follow(_ids(job), correlation_id, last, held, deltas)
        stale = True
        while True:
            if stale:
                stored = _stored(job, follow.correlation_id, follow.last, held)
                events, ended = follow.stored(stored)
                yield from events
                if ended:
                    return
                if not stored and job.status().status.finished:
                    # Its end is at or before ``since``, or was stored just now.
                    yield from follow.rest(
                        _rest(job, follow.correlation_id, follow.last, waiter, held)
                    )
                    return
            behind = follow.behind()
            live = waiter.wait(subscription, behind=behind)
            if live is None and stop is not None and stop.is_set():
                return
            # on a quiet period look in Postgres anyway; and while an
            # announced event is not readable yet (an older transaction is
            # still open), look again even if only deltas came meanwhile
            due, announced = follow.live(live or [])
            yield from due
            stale = live is None or behind or announced


def _stream(job: Job) -> str:
    return events_stream(job._client.runtime.settings.redis_prefix, job.root_id)
