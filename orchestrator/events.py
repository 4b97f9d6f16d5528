"""Events: stored in the transaction of the change they describe, then published.

:class:`Outbox` collects the events of one transaction and stores them with
one multi-row INSERT just before it commits; after commit, ``publish`` sends
them to the root's Redis Stream for live followers. Postgres stays the
source of truth: a follower that misses a live entry reads it from there.

Numbering (``seq``, increasing per root, not contiguous). On Postgres an
event's ``seq`` is its transaction's id shifted left by :data:`SEQ_BITS`
plus its index in that transaction, so no row is locked to number events:
the children of one tree write and commit theirs concurrently. Commit order
is not xid order, so readers bound what they return with
:func:`visible_below`: only events of transactions older than every
transaction still running when the read's snapshot was taken. Whatever
commits later has an id at or above that bound, so it sorts after
everything already returned, and a follower that resumes with ``seq > last``
never misses it. The embedded SQLite file serializes writers, so there an
event takes the next number of its root and every read sees all committed.

Size. An event describes a change; it does not hold a second copy of what
the change stored. The one large field of the events in :data:`PREVIEWED`
(a tool's result, a call's params, an assistant message's text) is carried
whole up to :data:`PREVIEW_CHARS` characters (of its JSON, or of the text);
a longer one is cut to that many, with ``truncated: true`` and ``size``, its
full length. The full value is in the conversation's messages.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

import redis
from redis.typing import EncodableT, FieldT
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Insert,
    Update,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    text,
    union_all,
)
from sqlalchemy.engine import Connection
from sqlmodel import Session, col

from orchestrator.keys import events_stream
from orchestrator.store.db import Db, connection_of
from orchestrator.store.dialect import has_snapshots, numbers_in_select, writes_in_ctes
from orchestrator.store.fast_executor import execute
from orchestrator.store.statements import Riders
from orchestrator.store.tables import EventRow, table, utcnow
from schemas import Event, EventName

log = logging.getLogger(__name__)

#: Bits of ``seq`` that number the events within one transaction (Postgres).
SEQ_BITS = 20
#: ``seq`` of the first event of this transaction (Postgres).
_XACT_BASE = text(f"(pg_current_xact_id()::text::bigint << {SEQ_BITS})")
#: Every event with a ``seq`` below this is committed (or rolled back) for
#: good in the statement's snapshot: its transaction is older than the
#: oldest one still running (Postgres).
_SNAPSHOT_BOUND = text(f"(pg_snapshot_xmin(pg_current_snapshot())::text::bigint << {SEQ_BITS})")


#: Characters of a large field an event carries (see the module's docstring).
PREVIEW_CHARS = 2000
#: The field of each event that may be large.
PREVIEWED = {
    EventName.TOOL_COMPLETED: "result",
    EventName.TOOL_FAILED: "result",
    EventName.SUBAGENT_COMPLETED: "result",
    EventName.SUBAGENT_FAILED: "result",
    EventName.SUBAGENT_STOPPED: "result",
    EventName.TOOL_REQUESTED: "params",
    EventName.TOOL_APPROVAL_REQUESTED: "params",
    EventName.SUBAGENT_REQUESTED: "params",
    EventName.ASSISTANT_MESSAGE: "text",
    EventName.AGENT_HANDOFF: "message",
}


def preview(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data`` with ``data[key]`` cut to :data:`PREVIEW_CHARS` if longer."""
    value = data.get(key)
    if value is None or isinstance(value, bool | int | float):
        return data
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) <= PREVIEW_CHARS:
        return data
    return {**data, key: text[:PREVIEW_CHARS], "truncated": True, "size": len(text)}


def visible_below(session: Session) -> ColumnElement[bool] | None:
    """The condition a read of stored events adds so that nothing it leaves
    out can later commit below what it returned (None: no bound needed)."""
    if not has_snapshots(session):
        return None
    return col(EventRow.seq) < _SNAPSHOT_BOUND


def snapshot_bound(session: Session) -> int:
    """The bound :func:`visible_below` applies in a statement run now (Postgres)."""
    return int(session.execute(select(_SNAPSHOT_BOUND)).scalar_one())


def committed_horizon(session: Session) -> int | None:
    """A ``seq`` that every transaction committed before this call sorts
    below: once :func:`visible_below` reaches it, a read sees them all
    (None: every read already does)."""
    if not has_snapshots(session):
        return None
    return int(
        session.execute(
            text(f"SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint << {SEQ_BITS}")
        ).scalar_one()
    )


def row_to_event(row: EventRow | Pending, seq: int | None = None) -> Event:
    """The event of a stored row, or of a pending one numbered ``seq``."""
    return Event(
        name=EventName(row.name),
        conversation_id=row.conversation_id,
        root_id=row.root_id,
        turn_id=row.turn_id,
        step=row.step,
        correlation_id=row.correlation_id,
        time=row.created_at,
        seq=seq if seq is not None else getattr(row, "seq", None),
        data=row.data,
    )


class ConversationIds(Protocol):
    """What an event needs of its conversation (a row, or the columns of one)."""

    @property
    def id(self) -> str: ...
    @property
    def root_id(self) -> str: ...


class TurnIds(Protocol):
    """What an event needs of its turn (a row, or the columns of one)."""

    @property
    def id(self) -> str: ...
    @property
    def correlation_id(self) -> str: ...


class CallIds(Protocol):
    """What an event about a tool call needs of it (a row, or the columns of one)."""

    @property
    def step(self) -> int: ...
    @property
    def tool(self) -> str: ...
    @property
    def tool_request_id(self) -> str: ...


class Pending(NamedTuple):
    """An event recorded and not stored yet: its columns but ``seq``, in
    the order of :data:`_COLUMNS` (a plain tuple: cheaper than a row object)."""

    root_id: str
    name: EventName
    conversation_id: str
    turn_id: str | None
    step: int | None
    correlation_id: str | None
    data: dict[str, Any]
    created_at: datetime


_TABLE = table(EventRow)
#: The columns a :class:`Pending` event fills.
_COLUMNS = Pending._fields
_NAME = _COLUMNS.index("name")
#: The stored events' ids and numbers, for :meth:`Outbox._numbered`.
_RETURNED = (_TABLE.c.id, _TABLE.c.seq)


@lru_cache(maxsize=1024)
def _keys(index: int) -> tuple[tuple[str, ...], str]:
    """The parameter names of the ``index``-th event of a statement: its
    columns', and that of its number (see :func:`_row`)."""
    return tuple(f"e{index}_{name}" for name in _COLUMNS), f"e{index}_n"


def _row(index: int, postgres: bool) -> dict[str, ColumnElement[Any]]:
    """The values of the ``index``-th event of a statement, as parameters.
    Its ``seq``: the transaction's base plus its number in the transaction
    (Postgres), or the root's last number plus its number in the root
    (SQLite); see the module's docstring."""
    keys, number_key = _keys(index)
    row: dict[str, ColumnElement[Any]] = {
        name: bindparam(key, type_=_TABLE.c[name].type)
        for name, key in zip(_COLUMNS, keys, strict=True)
    }
    number = bindparam(number_key, type_=BigInteger)
    if postgres:
        row["seq"] = _XACT_BASE + number
    else:
        last = (
            select(func.coalesce(func.max(_TABLE.c.seq), 0))
            .where(_TABLE.c.root_id == row["root_id"])
            .scalar_subquery()
        )
        row["seq"] = last + number
    return row


#: Events of one statement up to which the statement is built once and
#: reused; a larger batch (a wide fan-out's) is built for its own flush.
_REUSED_UP_TO = 32
#: Most events one INSERT stores (9 parameters each): a larger flush is
#: several statements, as a statement may carry at most 65,535 parameters.
_INSERTED_AT_ONCE = 1000


def _insert(
    count: int, postgres: bool, guard: Update | None = None, riders: Riders | None = None
) -> Insert:
    """The INSERT of ``count`` events; with ``guard``, a conditional UPDATE
    run as its data-modifying CTE, storing them (and running ``riders``)
    only if it changed a row (Postgres, :meth:`Outbox.flush_if`). A
    reused statement is, on Postgres,
    an ``INSERT … SELECT``: SQLAlchemy compiles it once, where it compiles
    a multi-row VALUES on every run. A larger batch is built for its own
    flush, as a multi-row VALUES: Postgres plans that faster than a long
    UNION ALL."""
    if count <= _REUSED_UP_TO:
        return _reused_insert(count, postgres, guard, riders)
    return _build_insert(count, postgres, (guard, riders), selected=guard is not None)


def _stored(
    connection: Connection, count: int, statement: Insert, params: Mapping[str, Any]
) -> list[Any]:
    """The rows ``statement``, the INSERT of ``count`` events, returned: a
    reused statement runs on the driver (:func:`orchestrator.store.fast_executor.execute`),
    one built for this flush through SQLAlchemy (which caches its
    compilation by the statement's structure, not by the object)."""
    if count <= _REUSED_UP_TO:
        return execute(connection, statement, params).all()
    return list(connection.execute(statement, params).all())


@lru_cache(maxsize=512)
def _reused_insert(
    count: int, postgres: bool, guard: Update | None, riders: Riders | None
) -> Insert:
    return _build_insert(count, postgres, (guard, riders), selected=postgres)


def _build_insert(
    count: int,
    postgres: bool,
    guarded: tuple[Update | None, Riders | None],
    selected: bool,
) -> Insert:
    """``count`` events as a multi-row VALUES (whose ids follow the rows'
    order), or as an ``INSERT … SELECT`` (``selected``, Postgres), each row
    selected only if the guard (if any) changed a row; the riders, if any,
    are CTEs after the guard's. The guard runs first: the events' SELECTs
    read it (so it takes its row locks before any rider)."""
    guard, riders = guarded
    rows = [_row(i, postgres) for i in range(count)]
    if not selected:
        return insert(_TABLE).values(rows).returning(*_RETURNED)
    selects = [select(*(value.label(name) for name, value in row.items())) for row in rows]
    statement = insert(_TABLE)
    if guard is not None:
        written = guard.returning(literal(1).label("one")).cte("written")
        has_written = exists(select(written.c.one))
        selects = [s.where(has_written) for s in selects]
        rides = riders(has_written) if riders is not None else ()
        statement = statement.add_cte(
            written, *(ride.cte(f"ride{i}") for i, ride in enumerate(rides))
        )
    return statement.from_select(list(rows[0]), union_all(*selects)).returning(*_RETURNED)


@dataclass
class Outbox:
    """Events of one transaction: numbered and stored just before it commits
    (:meth:`flush`), published once it has (:meth:`publish`).

    Numbering takes no lock: concurrent transactions of one tree (the
    children of a fan-out, parallel tool calls) store their events side by
    side and are ordered by their transaction ids.
    """

    pending: list[Pending] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: Events of this transaction stored so far (their index in it).
    numbered: int = 0

    def record(
        self,
        name: EventName,
        conv: ConversationIds,
        turn: TurnIds | None,
        step: int | None = None,
        **data: Any,
    ) -> None:
        """Add an event about ``conv`` in ``turn`` to this transaction
        (``turn`` None: a conversation that never ran a turn). A large
        field is carried as a preview (see the module's docstring)."""
        key = PREVIEWED.get(name)
        if key is not None:
            data = preview(data, key)
        self.pending.append(
            Pending(
                conv.root_id,
                name,
                conv.id,
                turn.id if turn else None,
                step,
                turn.correlation_id if turn else None,
                data,
                utcnow(),
            )
        )

    def record_call(
        self, name: EventName, conv: ConversationIds, turn: TurnIds, call: CallIds, **data: Any
    ) -> None:
        """Add an event about tool call ``call`` (its step, tool and
        request id, then ``data``) to this transaction."""
        self.record(
            name,
            conv,
            turn,
            call.step,
            tool=call.tool,
            tool_request_id=call.tool_request_id,
            **data,
        )

    def discard(self) -> None:
        """Forget the pending events (their transaction is rolled back)."""
        self.pending.clear()

    def flush(self, db: Db) -> None:
        """Store the pending events with one INSERT (one per
        :data:`_INSERTED_AT_ONCE`), numbering them (see the module's
        docstring), and keep them for :meth:`publish`. A session's own
        changes are flushed first, as before any statement."""
        if not self.pending:
            return
        if isinstance(db, Session):
            db.flush()
        connection = connection_of(db)
        postgres = numbers_in_select(connection)
        while self.pending:
            rows, params = self._take(postgres, _INSERTED_AT_ONCE)
            statement = _insert(len(rows), postgres)
            self._numbered(postgres, rows, _stored(connection, len(rows), statement, params))

    def flush_if(
        self,
        db: Db,
        guard: Update,
        params: Mapping[str, Any] | None = None,
        riders: Riders | None = None,
    ) -> bool:
        """Run ``guard``, a conditional UPDATE, and store the pending events
        (and run ``riders``' writes) only if it changed a row, in ONE
        statement (Postgres: data-modifying CTEs): in an autocommit session
        the change and its events commit together in a single round trip.
        Returns whether ``guard`` changed a row (if not, the events are
        dropped).

        ``guard`` is meant to be built once (module level) with its values
        as ``bindparam``s, given in ``params``: the statement around it is
        then built once per guard and number of events. It updates at most
        one row, by its key: the statement reads it first, so that row is
        locked before any other (the one lock order); each rider writes
        only under the condition it is given."""
        connection = connection_of(db)
        if not writes_in_ctes(connection):
            raise ValueError("flush_if needs Postgres; use a transaction and flush")
        if len(self.pending) > _INSERTED_AT_ONCE:
            raise ValueError(f"flush_if stores at most {_INSERTED_AT_ONCE} events")
        rows, values = self._take(postgres=True)
        if params:
            values.update(params)
        statement = _insert(len(rows), True, guard, riders)
        stored = _stored(connection, len(rows), statement, values)
        if not stored:
            self.numbered -= len(rows)
            return False
        self._numbered(True, rows, stored)
        return True

    def _take(
        self, postgres: bool, most: int | None = None
    ) -> tuple[list[Pending], dict[str, Any]]:
        """The pending events (the ``most`` first, if given), and the
        parameters that store them numbered (see :func:`_row`)."""
        cut = len(self.pending) if most is None else most
        rows, self.pending = self.pending[:cut], self.pending[cut:]
        index = self.numbered
        self.numbered += len(rows)
        if self.numbered >= 1 << SEQ_BITS:
            raise ValueError(f"more than {1 << SEQ_BITS} events in one transaction")
        in_root: dict[str, int] = {}
        params: dict[str, Any] = {}
        for i, row in enumerate(rows):
            keys, number_key = _keys(i)
            params.update(zip(keys, row, strict=True))
            params[keys[_NAME]] = row.name.value  # the column holds the name's text
            if postgres:
                params[number_key] = index + i
            else:  # one writer at a time: the root's next numbers
                params[number_key] = in_root[row.root_id] = in_root.get(row.root_id, 0) + 1
        return rows, params

    def _numbered(self, postgres: bool, rows: list[Pending], stored: Any) -> None:
        """Number ``rows`` as the INSERT did; keep them for publishing."""
        if postgres:
            base = max(number for _, number in stored) >> SEQ_BITS << SEQ_BITS
            first = self.numbered - len(rows)
            numbers = [base + offset for offset in range(first, self.numbered)]
        else:  # ids follow the rows' order in the VALUES list
            numbers = [number for _, number in sorted(stored)]
        self.events.extend(row_to_event(row, seq) for row, seq in zip(rows, numbers, strict=True))

    def publish(self, client: redis.Redis, prefix: str, maxlen: int, ttl: int) -> None:
        """Send to the live streams (see :func:`publish_events`); a Redis
        failure is logged, never raised: the events are already stored."""
        if not self.events:
            return
        try:
            publish_events(client, prefix, maxlen, ttl, self.events)
        except redis.RedisError:
            log.warning("could not publish %d events live", len(self.events), exc_info=True)
        self.events.clear()


#: Field of a stream entry holding the event as JSON.
ENTRY_EVENT = "e"
#: Field of a stream entry naming the event, so that a reader that wants
#: only some events (``result()`` waits for a turn's end) skips the others
#: without parsing them.
ENTRY_NAME = "n"


#: Largest event a stream entry carries whole, in characters of its JSON.
#: A larger stored event is announced by a cut entry (:func:`is_cut`); a
#: larger delta is split into several.
ENTRY_CHARS = 8000
#: Characters of text in one delta entry: even escaped six characters to
#: one, they stay well within :data:`ENTRY_CHARS`.
DELTA_CHARS = 1000
#: Prefix of a cut entry's name. An old reader that waits only for some
#: names (a turn's end) skips it rather than take it for the event whole.
CUT = "cut:"


def is_cut(fields: Mapping[str, str]) -> bool:
    """Whether a stream entry announces an event without its data: the
    reader takes the event from Postgres."""
    return fields.get(ENTRY_NAME, "").startswith(CUT)


def stream_entries(event: Event) -> list[dict[FieldT, EncodableT]]:
    """The live stream entries of ``event``, each within :data:`ENTRY_CHARS`:
    one entry (its name ``n`` beside the event ``e``); for a stored event
    larger than that, one whose event has its ``data`` replaced by its size
    and whose name is marked cut; for a larger delta, one per piece of text."""
    whole = event.model_dump_json()
    if len(whole) <= ENTRY_CHARS:
        return [{ENTRY_EVENT: whole, ENTRY_NAME: event.name.value}]
    text = str(event.data.get("text", ""))
    if event.seq is None and len(text) > DELTA_CHARS:  # live only: none to read back
        return [
            entry
            for start in range(0, len(text), DELTA_CHARS)
            for entry in stream_entries(
                event.model_copy(
                    update={"data": {**event.data, "text": text[start : start + DELTA_CHARS]}}
                )
            )
        ]
    stub = event.model_copy(update={"data": {"cut": True, "size": len(whole)}})
    return [{ENTRY_EVENT: stub.model_dump_json(), ENTRY_NAME: CUT + event.name.value}]


def publish_events(
    client: redis.Redis, prefix: str, maxlen: int, ttl: int, events: list[Event]
) -> None:
    """Append ``events`` to their roots' streams in one round trip, each
    stream capped at about ``maxlen`` entries and set to expire ``ttl``
    seconds later: a tree's stream goes ``ttl`` seconds after its last
    event (its last turn's end), every stream has an expiry whatever
    publish was lost, and followers read Postgres once it is gone."""
    pipe = client.pipeline(transaction=False)
    streams: set[str] = set()
    for event in events:
        stream = events_stream(prefix, event.root_id)
        streams.add(stream)
        for entry in stream_entries(event):
            pipe.xadd(stream, entry, maxlen=maxlen, approximate=True)
    for stream in streams:
        pipe.expire(stream, ttl)
    pipe.execute()


def publish_live(client: redis.Redis, prefix: str, maxlen: int, ttl: int, event: Event) -> None:
    """Publish a live-only event (a delta); lost deltas cost nothing durable."""
    try:
        publish_events(client, prefix, maxlen, ttl, [event])
    except redis.RedisError:
        log.debug("could not publish a live event", exc_info=True)


class DeltaBatcher:
    """Coalesces a stream's text pieces into few live events.

    The first piece goes out at once (time to first token), then pieces
    collected for at least ``interval`` seconds go out as one text: a few
    Redis writes a second per stream instead of one per chunk. Call
    :meth:`flush` when the stream ends, whatever way it ends. Not
    thread-safe: one batcher per stream, fed by the thread reading it.
    """

    def __init__(
        self,
        publish: Callable[[str], None],
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._publish = publish
        self._interval = interval
        self._clock = clock
        self._pieces: list[str] = []
        self._sent_at: float | None = None

    def add(self, text: str) -> None:
        """Take a piece; publish what is pending if ``interval`` has passed."""
        self._pieces.append(text)
        if self._sent_at is None or self._clock() - self._sent_at >= self._interval:
            self.flush()

    def flush(self) -> None:
        """Publish what is pending, if anything."""
        if not self._pieces:
            return
        text = "".join(self._pieces)
        self._pieces.clear()
        self._sent_at = self._clock()
        self._publish(text)
