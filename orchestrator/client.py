"""The Python client: submit jobs, follow their events, read results."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam
from sqlmodel import Session, col, select

from orchestrator import registry, tracing
from orchestrator.celery_conf import make_celery
from orchestrator.dispatch import CeleryDispatcher
from orchestrator.engine import conversations, inbox
from orchestrator.engine.actions import Dispatcher, TakeCheckpoint
from orchestrator.engine.cancel import cancel
from orchestrator.engine.history import load_history
from orchestrator.engine.tool_outputs import archived
from orchestrator.engine.turns import JobRef, start_turn
from orchestrator.errors import (
    ConfigurationError,
    ConversationNotFound,
    InvalidRequestError,
    JobFailedError,
    ToolOutputNotFound,
    invalid,
)
from orchestrator.events import (
    CUT,
    ENTRY_EVENT,
    committed_horizon,
    is_cut,
    row_to_event,
    snapshot_bound,
    visible_below,
)
from orchestrator.keys import events_stream
from orchestrator.runtime import Runtime
from orchestrator.settings import Settings, load_settings
from orchestrator.store.tables import Conversation, EventRow, Turn, table
from orchestrator.store.values import check
from orchestrator.streams import StreamReader, Subscription
from orchestrator.turn_ends import TurnEnds
from schemas import (
    TERMINAL_TURN_EVENTS,
    AgentSpec,
    Budget,
    Event,
    JobRequest,
    JobStatus,
    Message,
    MessageOptions,
    TodoItem,
    TurnStatus,
    Usage,
)
from schemas.jobs import DEFAULT_PRIORITY

#: Longest id a caller may name: a job, a conversation (as ``submit``
#: takes it), a queued message's entry, an archived output's handle.
MAX_ID_CHARS = 64
#: Largest event sequence number (Postgres ``bigint``).
MAX_SEQ = 2**63 - 1


def _refuse(field: str, expected: str, value: object) -> InvalidRequestError:
    got = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
    return InvalidRequestError(f"{field}: expected {expected}, got {got}", [field])


def _id(value: object, field: str) -> str:
    """``value`` if it could be an id: a storable string of 1 to
    :data:`MAX_ID_CHARS` characters; else :class:`InvalidRequestError`
    naming ``field`` (the same checks as ``submit``)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise _refuse(field, f"a string of 1 to {MAX_ID_CHARS} characters", value)
    check(value, field)
    return value


def _known(conversation_id: object) -> str:
    """The id, if it could name a conversation (else :class:`InvalidRequestError`)."""
    return _id(conversation_id, "conversation_id")


def _timeout(value: object) -> float | None:
    """None (no bound), or seconds: a number, not negative, not NaN."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise _refuse("timeout", "None or a number of seconds >= 0", value)
    return math.inf if value > 1e300 else float(value)  # an int past float's range


def _since(value: object) -> int:
    """An event sequence number to resume after (None: from the start)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        raise _refuse("since", f"None or an integer from 0 to {MAX_SEQ}", value)
    return value


class Client:
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
        self.celery = make_celery(self.settings, main="chorus-client")
        self.dispatcher: Dispatcher = dispatcher or CeleryDispatcher(self.celery)

    @cached_property
    def ends(self) -> TurnEnds:
        """The one checker in Postgres of the turns this client's waiters wait for."""
        return TurnEnds(self.runtime)

    @cached_property
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
        """
        trace = tracing.submitted(trace_parent)
        try:
            request = JobRequest(
                agent=agent,
                input=input,
                conversation_id=conversation_id,
                context_data=context_data or {},
                idempotency_key=idempotency_key,
                budget=budget,
                priority=priority,
            )
        except ValidationError as exc:
            raise invalid(exc, "job request") from None
        ref, actions = start_turn(self.runtime, request)
        with tracing.sending(trace):
            self.dispatcher.send(actions)
        return Job(self, ref)

    def job(self, job_id: str) -> Job:
        """A handle on an existing job."""
        with self.runtime.session() as session:
            turn = session.get(Turn, _id(job_id, "job_id"))
            if turn is None:
                raise InvalidRequestError(f"no job {job_id!r}", ["job_id"])
            return Job(self, JobRef(turn.id, turn.conversation_id, turn.root_id))

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
        try:
            options = MessageOptions(context_data=context_data, budget=budget, priority=priority)
        except ValidationError as exc:
            raise invalid(exc, "message") from None
        entry, actions = inbox.send(self.runtime, _known(conversation_id), text, options)
        self.dispatcher.send(actions)
        return entry

    def job_for_message(self, conversation_id: str, entry_id: str) -> Job | None:
        """The job a sent message started, or None while it still waits."""
        key = inbox.idempotency_key(_known(conversation_id), _id(entry_id, "entry_id"))
        with self.runtime.session() as session:
            turn = session.exec(select(Turn).where(Turn.idempotency_key == key)).first()
            return Job(self, JobRef(turn.id, turn.conversation_id, turn.root_id)) if turn else None

    def clear_queue(self, conversation_id: str) -> int:
        """Drop the conversation's queued messages (``queue.cleared``); returns how many."""
        return inbox.clear(self.runtime, _known(conversation_id))

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
        revoke, actions = cancel(self.runtime, _id(job_id, "job_id"))
        if revoke:
            self.dispatcher.revoke(revoke)
        self.dispatcher.send(actions)

    def checkpoint(self, conversation_id: str) -> None:
        """Summarize the conversation in the background (``checkpoint.started|completed``):
        later prompts hold the summary instead of the messages before it."""
        with self.runtime.session() as session:
            if session.get(Conversation, _known(conversation_id)) is None:
                raise ConversationNotFound(conversation_id)
        self.dispatcher.send([TakeCheckpoint(conversation_id, DEFAULT_PRIORITY)])

    def fork(self, conversation_id: str) -> str:
        """A new conversation with a copy of this one's messages; returns its id."""
        return conversations.fork(self.runtime, _known(conversation_id))

    def clear(self, conversation_id: str) -> int:
        """Delete the conversation's messages and its plan; returns how many messages."""
        return conversations.clear(self.runtime, _known(conversation_id))

    def load(self, conversation_id: str, messages: list[Message] | list[dict[str, Any]]) -> int:
        """Replace the conversation's history with ``messages`` (validated);
        its plan is dropped."""
        return conversations.load(self.runtime, _known(conversation_id), messages)

    def usage(self, conversation_id: str) -> Usage:
        """Tokens and cost of every model call of the conversation."""
        with self.runtime.session() as session:
            conv = session.get(Conversation, _known(conversation_id))
            if conv is None:
                raise ConversationNotFound(conversation_id)
            return Usage(
                input_tokens=conv.input_tokens,
                output_tokens=conv.output_tokens,
                cost_usd=conv.cost_usd,
            )

    def plan(self, conversation_id: str) -> list[TodoItem]:
        """The conversation's plan, as its agent last wrote it with
        ``manage_todo_list`` (``plan.updated``); empty before the first."""
        with self.runtime.session() as session:
            conv = session.get(Conversation, _known(conversation_id))
            if conv is None:
                raise ConversationNotFound(conversation_id)
            return [TodoItem.model_validate(item) for item in conv.plan or []]

    def history(self, conversation_id: str) -> list[Message]:
        """Every stored message of the conversation, oldest first."""
        with self.runtime.session() as session:
            if session.get(Conversation, _known(conversation_id)) is None:
                raise ConversationNotFound(conversation_id)
            return load_history(session, conversation_id)

    def tool_output(self, conversation_id: str, handle: str) -> Any:
        """The whole result of a tool call whose output passed its agent's
        ``tool_output_limit`` (the model saw a view of it), by the handle in
        that view and in the call's ``tool.completed`` event; the call must
        be in this conversation's tree (its root, or any subagent of it)."""
        handle = _id(handle, "handle")
        with self.runtime.session() as session:
            conv = session.get(Conversation, _known(conversation_id))
            if conv is None:
                raise ConversationNotFound(conversation_id)
            try:
                return archived(session, conv.root_id, handle)
            except LookupError:
                raise ToolOutputNotFound(handle) from None

    def close(self) -> None:
        if "streams" in self.__dict__:
            self.streams.close()
        if "ends" in self.__dict__:
            self.ends.close()
        self.celery.close()


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
            turn = connection.execute(_STATUS, {"id": self.id}).one()
            return JobStatus(
                job_id=turn.id,
                conversation_id=turn.conversation_id,
                root_id=turn.root_id,
                agent=turn.agent,
                status=TurnStatus(turn.status),
                step=turn.steps,
                output=turn.output,
                structured=turn.structured,
                error=turn.error,
                usage=Usage(
                    input_tokens=turn.input_tokens,
                    output_tokens=turn.output_tokens,
                    cost_usd=turn.cost_usd,
                ),
                tree_usage=Usage(
                    input_tokens=turn.tree_input_tokens,
                    output_tokens=turn.tree_output_tokens,
                    cost_usd=turn.tree_cost_usd,
                ),
            )

    def result(self, timeout: float | None = None) -> str:
        """Wait for the turn to end; return the final answer.

        Raises :class:`TimeoutError` after ``timeout`` seconds and
        :class:`~orchestrator.errors.JobFailedError` if the turn failed or
        was cancelled.
        """
        ended = _wait_end(self, _timeout(timeout))
        if isinstance(ended, Event):  # the end event carries status, output and error
            status, output, error = (ended.data.get(k) for k in ("status", "output", "error"))
        else:
            status, output, error = ended.status.value, ended.output, ended.error
        if status != TurnStatus.COMPLETED.value:
            raise JobFailedError(self.id, str(status), error)
        return output or ""

    def events(
        self, since: int | None = None, *, timeout: float | None = None, deltas: bool = True
    ) -> Iterator[Event]:
        """Yield the job's events in order, live, until its turn ends.

        Stored events come from Postgres, then the root's Redis Stream feeds
        new ones; any gap is filled from Postgres. ``since`` resumes after
        that sequence number. ``assistant.delta`` events (live only) are
        included unless ``deltas`` is False.
        """
        if not isinstance(deltas, bool):
            raise _refuse("deltas", "a bool", deltas)
        return _follow(self, _since(since), _timeout(timeout), deltas)


def _stored(
    job: Job, correlation_id: str, after: int, held: _HeldDeltas | None = None
) -> list[Event]:
    """The job's stored events after ``after``, in order, up to the bound
    below which nothing can commit any more (so resuming after the last one
    never skips an event that commits later). ``held``: told, before the
    read, how far it reaches (:meth:`_HeldDeltas.catch_up`)."""
    with job._client.runtime.session() as session:
        if held is not None:
            held.catch_up(session)
        query = select(EventRow).where(
            EventRow.root_id == job.root_id,
            EventRow.seq > after,
            EventRow.correlation_id == correlation_id,
        )
        bound = visible_below(session)
        if bound is not None:
            query = query.where(bound)
        rows = session.exec(query.order_by(col(EventRow.seq))).all()
        return [row_to_event(r) for r in rows]


def _rest(
    job: Job, correlation_id: str, after: int, waiter: _Waiter, held: _HeldDeltas
) -> list[Event]:
    """Every stored event after ``after`` that committed before this call:
    waits (within the waiter's timeout) until the transactions older than
    them have all ended."""
    with job._client.runtime.session() as session:
        horizon = committed_horizon(session)
        pause = CATCH_UP
        while horizon is not None and snapshot_bound(session) < horizon:
            session.rollback()
            time.sleep(waiter.remaining(pause))
            pause = min(QUIET_POLL, pause * 2)
    return _stored(job, correlation_id, after, held)


_TURN = table(Turn)
#: What :meth:`Job.status` reads, built once (its cache key is memoized) and
#: run as Core: the columns it shows, not the whole ORM row.
_STATUS = select(
    *(
        _TURN.c[name]
        for name in (
            "id",
            "conversation_id",
            "root_id",
            "agent",
            "status",
            "steps",
            "output",
            "structured",
            "error",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "tree_input_tokens",
            "tree_output_tokens",
            "tree_cost_usd",
        )
    )
).where(_TURN.c.id == bindparam("id"))
#: The events that end a turn, by the name their stream entries carry
#: (whole, or cut: too large for an entry).
_TERMINAL_NAMES = frozenset(
    name for event in TERMINAL_TURN_EVENTS for name in (event.value, CUT + event.value)
)


def _is_end(job: Job, event: Event) -> bool:
    return (
        event.turn_id == job.id
        and event.conversation_id == job.conversation_id
        and event.name in TERMINAL_TURN_EVENTS
    )


#: Quiet seconds before a waiter re-reads Postgres anyway (a publish lost
#: between commit and Redis costs at most this delay); doubles while nothing
#: happens, up to the maximum, so a thousand idle waiters stay cheap.
QUIET_POLL = 1.0
QUIET_POLL_MAX = 10.0
#: First pause before reading again when an event announced live is stored
#: but not yet readable (a transaction older than it still runs); doubles
#: up to ``QUIET_POLL``.
CATCH_UP = 0.01


class _Waiter:
    """The shared stream reader's wake-ups for one job, with its deadline."""

    def __init__(self, job: Job, timeout: float | None) -> None:
        self.job = job
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
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
        client.streams.subscribe(_stream(job), _TERMINAL_NAMES) as subscription,
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
                    event = Event.model_validate_json(fields[ENTRY_EVENT])
                    if _is_end(job, event):  # a cut one has no output: ask Postgres
                        return job.status() if is_cut(fields) else event


def _follow(job: Job, last: int, timeout: float | None, deltas: bool) -> Iterator[Event]:
    """Postgres is read for every stored event, so order and completeness
    never depend on Redis; the stream wakes the follower and carries deltas.

    Ends with the turn's terminal event, or, when that event is at or
    before ``since`` (a follower resuming a finished turn), as soon as
    Postgres shows the turn finished.
    """
    waiter = _Waiter(job, timeout)
    with job._client.streams.subscribe(_stream(job)) as subscription:
        with job._client.runtime.session() as session:
            turn = session.get(Turn, job.id)
            assert turn is not None
            correlation_id = turn.correlation_id
            # after subscribing: whatever commits later is announced live
            held = _HeldDeltas(committed_horizon(session) if deltas else None)
        stale = True
        announced = last  # the highest seq seen live
        while True:
            if stale:
                stored = _stored(job, correlation_id, last, held)
                for event in held.after(stored, last):
                    last = event.seq or last
                    yield event
                    if _is_end(job, event):
                        return
                if not stored and job.status().status.finished:
                    # Its end is at or before ``since``, or was stored just now.
                    rest = _rest(job, correlation_id, last, waiter, held)
                    yield from held.after(rest, last)
                    return
            behind = announced > last or held.waiting()
            events = waiter.wait(subscription, behind=behind)
            # on a quiet period look in Postgres anyway; and while an
            # announced event is not readable yet (an older transaction is
            # still open), look again even if only deltas came meanwhile
            stale = events is None or behind
            for event in events or []:
                if event.correlation_id != correlation_id:
                    continue
                if event.seq is None:
                    if deltas:
                        yield from held.add(announced, event, last)
                elif event.seq > last:
                    announced = max(announced, event.seq)
                    stale = True


class _HeldDeltas:
    """Live deltas a follower holds until it has yielded the stored events
    committed before they came (a step's ``llm.requested`` precedes its
    text): those announced live before a delta (their seq), and, for a
    follower that joined while older transactions still ran (a call under
    way, its ``llm.requested`` not readable yet), every event numbered
    below the cluster's horizon when it joined.

    Each delta waits for a ``mark``: it is yielded once every stored event
    below it is, that is before the first stored event at or above it, or
    after a read that reached it."""

    def __init__(self, horizon: int | None) -> None:
        self.horizon = horizon or 0  # 0: nothing to wait for
        self.caught_up = self.horizon == 0
        self.deltas: deque[tuple[int, Event]] = deque()

    def catch_up(self, session: Session) -> None:
        """Before a read of stored events: the read returns every event
        below the horizon if its bound has passed it (bounds only grow)."""
        if not self.caught_up and snapshot_bound(session) >= self.horizon:
            self.caught_up = True

    def waiting(self) -> bool:
        """Are deltas held for events committed before the follower joined?"""
        return bool(self.deltas) and not self.caught_up

    def _through(self, last: int) -> int:
        """Every stored event below this is yielded (``last``: the latest)."""
        return max(last + 1, self.horizon if self.caught_up else 0)

    def add(self, announced: int, delta: Event, last: int) -> Iterator[Event]:
        """Hold ``delta``, which came after the events announced up to
        ``announced``; yield what is due."""
        mark = announced + 1 if self.caught_up else max(announced + 1, self.horizon)
        self.deltas.append((mark, delta))
        return self._due(self._through(last))

    def _due(self, through: int) -> Iterator[Event]:
        while self.deltas and self.deltas[0][0] <= through:
            yield self.deltas.popleft()[1]

    def after(self, stored: list[Event], last: int) -> Iterator[Event]:
        """``stored`` (one read, after ``last``), each event preceded by the
        held deltas it lets go, and then those the whole read lets go."""
        for event in stored:
            last = event.seq or last
            yield from self._due(last)
            yield event
        yield from self._due(self._through(last))


def _stream(job: Job) -> str:
    return events_stream(job._client.runtime.settings.redis_prefix, job.root_id)
