"""The statements of ``chorus.step`` (:mod:`orchestrator.engine.step`), built once.

They are executed with parameters (``b_…``): building one per call (column
comparisons, coercions, an aliased entity) and generating its cache key
cost more CPU than the database's work. Writes whose rows the step does not
read back go to the tables (Core), without ORM bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Insert,
    Update,
    bindparam,
    exists,
    func,
    insert,
    or_,
    true,
    update,
)
from sqlalchemy import select as select_columns
from sqlalchemy.engine import Connection
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from orchestrator.events import Outbox
from orchestrator.store.clock import db_now
from orchestrator.store.db import Db, connection_of
from orchestrator.store.dialect import returns_joined_rows, writes_in_ctes
from orchestrator.store.fast_executor import execute
from orchestrator.store.job_totals import LOCK_JOB, ROLL_UP, TREE_TOTALS, lock_job, roll_up
from orchestrator.store.rows import ConversationRow, TurnRow, columns, take
from orchestrator.store.statements import MESSAGE_VALUES, Riders, message_params, new_rows_if, run
from orchestrator.store.tables import Conversation, MessageRow, ToolCallRow, Turn, table
from schemas import ConversationState, Usage

_CONVERSATIONS = table(Conversation)
_TURNS = table(Turn)
_MESSAGES = table(MessageRow)
_TOOL_CALLS = table(ToolCallRow)

_JOB = aliased(Turn, name="job")

_JOB_TURNS = _TURNS.alias("job")


#: The conversation ``b_conv`` runs its turn ``b_turn`` and its cursor is at
#: the model call of step ``b_step``.
_AT_STEP = (
    _CONVERSATIONS.c.id == bindparam("b_conv"),
    _CONVERSATIONS.c.state == ConversationState.RUNNING.value,
    _CONVERSATIONS.c.turn_id == bindparam("b_turn"),
    _CONVERSATIONS.c.cursor_step == bindparam("b_step"),
    _CONVERSATIONS.c.cursor_segment == -1,
)

#: The step is not deferred (a retry's backoff, a rate limit) past now: a
#: copy sent early (its countdown is capped below the broker's visibility
#: timeout) sends itself again instead (:data:`DEFERRED`).
_NOT_DEFERRED = or_(_CONVERSATIONS.c.due_at.is_(None), _CONVERSATIONS.c.due_at <= db_now())

#: When the step at ``b_step`` is due, and the database's time, if it is deferred past now.
DEFERRED = select_columns(_CONVERSATIONS.c.due_at, db_now(), _CONVERSATIONS.c.priority).where(
    *_AT_STEP, ~_NOT_DEFERRED
)

#: How many earlier owners a retry may take the lease over from (:func:`take_lease`).
HANDED_ON = 8

#: The model-call lease (:func:`take_lease`).
_TAKE = (
    update(_CONVERSATIONS)
    .where(
        *_AT_STEP,
        or_(
            _CONVERSATIONS.c.lease_until.is_(None),
            _CONVERSATIONS.c.lease_until < db_now(),  # the database's clock, not the worker's
            # this execution's own, or one of those its retry takes over from
            _CONVERSATIONS.c.lease_owner.in_(
                (bindparam("b_owner"), *(bindparam(f"b_previous_{i}") for i in range(HANDED_ON)))
            ),
        ),
        _NOT_DEFERRED,
        _TURNS.c.id == bindparam("b_turn"),
        _TURNS.c.conversation_id == _CONVERSATIONS.c.id,
        _JOB_TURNS.c.id == func.coalesce(_TURNS.c.job_id, _TURNS.c.id),
        _JOB_TURNS.c.stop_status.is_(None),
    )
    .values(lease_owner=bindparam("b_owner"), lease_until=db_now(bindparam("b_lease")))
)
#: The columns of the conversation, the turn and the job's turn, in order
#: (labelled: the three tables share column names).
_LEASED = (
    *columns(ConversationRow, _CONVERSATIONS, "c"),
    *columns(TurnRow, _TURNS, "t"),
    *columns(TurnRow, _JOB_TURNS, "j"),
)
#: Take the lease and read the step's columns: Core rows, not entities
#: (an ORM update is annotated anew at every execution, so SQLAlchemy
#: generated its cache key again each time, and loading two wide entities
#: cost more than the statement).
TAKE_JOINED = _TAKE.returning(*_LEASED)
#: SQLite, whose RETURNING cannot name joined tables: the lease, then
#: :data:`LEASED`.
TAKE_ALONE = _TAKE.returning(_CONVERSATIONS.c.id)
LEASED = select_columns(*_LEASED).where(
    _CONVERSATIONS.c.id == bindparam("b_conv"),
    _TURNS.c.id == bindparam("b_turn"),
    _TURNS.c.conversation_id == _CONVERSATIONS.c.id,  # joined: no cartesian product
    _JOB_TURNS.c.id == func.coalesce(_TURNS.c.job_id, _TURNS.c.id),
)


#: What a step reads as it takes the lease: its conversation, its turn and
#: the job's turn.
Leased = tuple[ConversationRow, TurnRow, TurnRow]


def leased(row: Sequence[Any]) -> Leased:
    """A row of :data:`TAKE_JOINED` or :data:`LEASED`, split in three."""
    conv, at = take(ConversationRow, row)
    turn, at = take(TurnRow, row, at)
    job, _ = take(TurnRow, row, at)
    return conv, turn, job


#: The conversation, the turn and the job's turn, the conversation's row
#: locked (:func:`owned_rows`).
_OWNED = (
    select(Conversation, Turn, _JOB)
    .where(
        col(Conversation.id) == bindparam("b_conv"),
        col(Turn.id) == bindparam("b_turn"),
        col(Turn.conversation_id) == Conversation.id,
        col(_JOB.id) == func.coalesce(Turn.job_id, Turn.id),
    )
    .with_for_update(of=Conversation)
    .execution_options(populate_existing=True)
)

_STORE_MESSAGE = insert(_MESSAGES)
_STORE_CALLS = insert(_TOOL_CALLS)

#: The turn's own usage of one model call (:func:`store_reply`).
_OWN_USAGE: dict[str, Any] = {
    "steps": bindparam("b_steps"),
    "input_tokens": _TURNS.c.input_tokens + bindparam("b_input"),
    "output_tokens": _TURNS.c.output_tokens + bindparam("b_output"),
    "cost_usd": _TURNS.c.cost_usd + bindparam("b_cost"),
}
ADD_USAGE = update(_TURNS).where(_TURNS.c.id == bindparam("b_turn")).values(_OWN_USAGE)
#: The same and, for a job's own turn, its tree totals: one update of the row.
ADD_USAGE_AND_TREE = ADD_USAGE.values(TREE_TOTALS)


_NEW_MESSAGE = insert(_MESSAGES).values(MESSAGE_VALUES)


@cache
def usage_with_message(tree: bool, lock: bool = False) -> Update:
    """Postgres: :data:`ADD_USAGE` (``tree``: :data:`ADD_USAGE_AND_TREE`) with
    the INSERT of the assistant message (:data:`_NEW_MESSAGE`) as a CTE: one
    statement, one round trip.

    ``lock``, for a step not on its job's root conversation: the job's root
    row is locked first (:data:`~orchestrator.store.job_totals.LOCK_JOB`, a
    CTE the update's condition waits on, so it runs before the update
    touches the turn), and for a turn that is not the job's own (``tree``
    False) the job's tree totals (:data:`~orchestrator.store.job_totals.ROLL_UP`)
    are a further CTE, run after the update: the root's row, the turn's,
    then the job's turn, the one lock order, in one statement where there
    were three."""
    usage = ADD_USAGE_AND_TREE if tree else ADD_USAGE
    ctes = [_NEW_MESSAGE.cte("stored")]
    if lock:
        locked = LOCK_JOB.cte("locked")
        held = exists(select_columns(locked.c.id))
        usage = usage.where(held)
        if not tree:
            ctes.append(ROLL_UP.where(held).cte("rolled"))
    return usage.add_cte(*ctes)


#: A step that stores a batch of tools to run (:func:`store_batch`): the
#: guard of its one statement. It moves the cursor to the batch's first segment if this
#: lease's owner still holds the step (the checks of ``persist.load_owned``),
#: gives the lease up, counts the move (``version``, progress) and adds the
#: model call's usage to the conversation's totals.
STEP_MOVE = (
    update(_CONVERSATIONS)
    .where(*_AT_STEP, _CONVERSATIONS.c.lease_owner == bindparam("b_owner"))
    .values(
        version=_CONVERSATIONS.c.version + 1,
        cursor_segment=0,
        lease_owner=None,
        lease_until=None,
        redispatches=0,
        step_failures=0,
        due_at=None,
        progress_at=db_now(),
        input_tokens=_CONVERSATIONS.c.input_tokens + bindparam("b_input"),
        output_tokens=_CONVERSATIONS.c.output_tokens + bindparam("b_output"),
        cost_usd=_CONVERSATIONS.c.cost_usd + bindparam("b_cost"),
    )
)


@cache
def batch_riders(calls: int) -> Riders:
    """The rest of :data:`STEP_MOVE`'s statement, for a batch of ``calls``:
    the turn's usage and the job's tree totals (a job's own turn on its
    root: one row), the assistant message and the calls
    (:func:`~orchestrator.store.statements.new_row_params`), each written
    only if the move took (``moved``)."""

    def riders(moved: ColumnElement[bool]) -> tuple[Insert | Update, ...]:
        return (
            ADD_USAGE_AND_TREE.where(moved),
            new_rows_if(MessageRow, moved),
            new_rows_if(ToolCallRow, moved, calls),
        )

    return riders


@cache
def release(owned: bool, deferred: bool, failed: bool = False) -> Update:
    """The statement of :func:`release_lease`, built once per form: by
    owner or not, whether it defers the step ``b_due_in`` seconds (the
    database's clock) and whether it records a failed model call: the retry
    count ``b_failures`` and the failure log ``b_failure_log``
    (:mod:`~orchestrator.engine.callpolicies`), in the same update."""
    where = [_CONVERSATIONS.c.id == bindparam("b_conv")]
    if owned:
        where.append(_CONVERSATIONS.c.lease_owner == bindparam("b_owner"))
    values: dict[str, Any] = {"due_at": db_now(bindparam("b_due_in"))} if deferred else {}
    if failed:
        values["step_failures"] = bindparam("b_failures")
        values["step_failure_log"] = bindparam(
            "b_failure_log", type_=_CONVERSATIONS.c.step_failure_log.type
        )
    return update(_CONVERSATIONS).where(*where).values(lease_owner=None, lease_until=None, **values)


# --- named operations: what the engine calls ----------------------------------


def take_lease(
    connection: Connection,
    ids: tuple[str, str, int],
    owners: tuple[str, Sequence[str]],
    seconds: float,
) -> Leased | None:
    """Take the model-call lease of step ``ids`` (conversation, turn, step)
    for the first of ``owners`` for ``seconds``, if the cursor is at that
    step, no live lease is held by another copy (the second of ``owners``,
    up to :data:`HANDED_ON` of them, are the failed executions whose retry
    this is: a lease one of them holds is taken over), the step is not
    deferred past now and
    the job is not being stopped, and read what the step reads of the
    conversation, the turn and the job's turn. One statement on Postgres
    (:data:`TAKE_JOINED`); on SQLite the lease, then :data:`LEASED`. Each
    commits on its own in an autocommit ``connection``. None: not taken."""
    conversation_id, turn_id, step = ids
    params = {
        "b_conv": conversation_id,
        "b_turn": turn_id,
        "b_step": step,
        "b_owner": owners[0],
        "b_lease": seconds,
    }
    previous = list(owners[1][:HANDED_ON])
    params.update(
        {f"b_previous_{i}": previous[i] if i < len(previous) else None for i in range(HANDED_ON)}
    )
    if returns_joined_rows(connection):
        found = run(connection, TAKE_JOINED, params).first()
    elif run(connection, TAKE_ALONE, params).first() is not None:
        found = run(connection, LEASED, params).first()
    else:
        found = None
    return None if found is None else leased(found)


#: The lease heartbeat's one UPDATE: by primary key, then owner (no scan
#: of the table); it returns the owners whose leases it extended.
_RENEW = (
    update(_CONVERSATIONS)
    .where(
        _CONVERSATIONS.c.id.in_(bindparam("b_ids", expanding=True)),
        _CONVERSATIONS.c.lease_owner.in_(bindparam("b_owners", expanding=True)),
    )
    .values(lease_until=db_now(bindparam("b_lease")))  # the database's clock
    .returning(_CONVERSATIONS.c.lease_owner)
)


def renew_leases(
    connection: Connection, conversation_ids: list[str], owners: list[str], seconds: float
) -> set[str]:
    """Extend by ``seconds`` each lease of ``conversation_ids`` still held by
    one of ``owners`` (one statement, committed on its own in an autocommit
    ``connection``); returns the owners that still hold theirs."""
    params = {"b_ids": conversation_ids, "b_owners": owners, "b_lease": seconds}
    return set(connection.execute(_RENEW, params).scalars())


def store_batch(db: Db, events: Outbox, params: dict[str, Any], calls: int) -> bool:
    """Store a step's batch of ``calls`` tools to run: the cursor's move to
    segment 0 and the lease's release if this copy still owns the step
    (:data:`STEP_MOVE`), and only then the turn's usage and the tree totals,
    the assistant message, the calls (:func:`batch_riders`) and ``events``'
    pending events (dropped if the move did not take). ``params``: those of
    the move and of the riders. False: the lease was lost or the cursor moved.

    Where one statement can write several tables (Postgres:
    :meth:`~orchestrator.events.Outbox.flush_if`) they are one statement,
    in an autocommit connection one round trip. Elsewhere they are several,
    so ``db`` must then be a transaction
    (:func:`~orchestrator.store.dialect.write_scope` gives either)."""
    riders = batch_riders(calls)
    if writes_in_ctes(db):
        return events.flush_if(db, STEP_MOVE, params, riders)
    if run(db, STEP_MOVE, params).rowcount != 1:
        events.discard()
        return False
    for write in riders(true()):
        run(db, write, params)
    events.flush(db)
    return True


def release_lease(
    db: Db,
    conversation_id: str,
    owner: str | None = None,
    due_in: float | None = None,
    failed: tuple[int, list[dict[str, Any]]] | None = None,
) -> None:
    """Give the model-call lease up (only if ``owner`` holds it, when given),
    deferring the step ``due_in`` seconds and recording ``failed`` (the
    retry count and failure log of a failed model call) in the same update
    (:func:`release`). A Core update: a conversation object a session holds
    keeps its loaded lease (nothing reads it after a release)."""
    params: dict[str, Any] = {"b_conv": conversation_id, "b_due_in": due_in}
    if owner is not None:
        params["b_owner"] = owner
    if failed is not None:
        params["b_failures"], params["b_failure_log"] = failed
    statement = release(owner is not None, due_in is not None, failed is not None)
    execute(connection_of(db), statement, params)


_RELEASE_OWNED = release(True, False).returning(_CONVERSATIONS.c.id)


def release_owned(db: Db, conversation_id: str, owner: str) -> bool:
    """Give the model-call lease up if ``owner`` still holds it; False if
    it does not (a stored reply gave it up, or another copy took it)."""
    params = {"b_conv": conversation_id, "b_owner": owner}
    return run(db, _RELEASE_OWNED, params).first() is not None


def owned_rows(session: Session, conversation_id: str, turn_id: str) -> tuple[Any, ...] | None:
    """The conversation (its row locked first: the one lock order), the
    turn and the job's turn, as entities loaded afresh."""
    found = session.execute(_OWNED, {"b_conv": conversation_id, "b_turn": turn_id}).first()
    return None if found is None else tuple(found)


def store_calls(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert a step's tool calls (every column given)."""
    session.execute(_STORE_CALLS, rows)


def store_message(session: Session, values: dict[str, Any]) -> None:
    """Insert one message."""
    session.execute(_STORE_MESSAGE, values)


def deferred_until(connection: Connection, ids: tuple[str, str, int]) -> Sequence[Any] | None:
    """When step ``ids`` is due, the database's time and the conversation's
    priority, if the step is deferred past now (:data:`DEFERRED`); else None."""
    conversation_id, turn_id, step = ids
    params = {"b_conv": conversation_id, "b_turn": turn_id, "b_step": step}
    return run(connection, DEFERRED, params).first()


def store_reply(
    session: Session,
    message: dict[str, Any],
    usage: dict[str, Any],
    job: tuple[str, bool, bool],
    rolled_up: tuple[Usage, int],
) -> None:
    """Store a step's assistant ``message`` and add its ``usage`` (the
    parameters of :data:`ADD_USAGE` and of
    :data:`~orchestrator.store.job_totals.TREE_TOTALS`) to its turn and to
    the job's tree totals. ``job``: the job's turn's id, whether the turn
    is the job's own, and whether the step's conversation is the job's
    root (whose row, locked already, orders the job's turn's writers);
    ``rolled_up``: the usage and tool calls a turn that is not the job's
    own adds to the job's totals. On Postgres one statement
    (:func:`usage_with_message`); on SQLite the root's lock if needed, the
    message, the turn's usage and the roll-up, in that order (the one lock
    order)."""
    job_id, jobs_own, on_root = job
    combined = jobs_own and on_root
    if writes_in_ctes(session):
        statement = usage_with_message(jobs_own, lock=not combined)
        session.execute(statement, {**message_params(message), **usage, "b_job": job_id})
        return
    if not combined:  # the root's row before any turn's: the one lock order
        lock_job(session, job_id)
    session.execute(_STORE_MESSAGE, message)
    session.execute(ADD_USAGE_AND_TREE if jobs_own else ADD_USAGE, usage)
    if not jobs_own:
        roll_up(session, job_id, *rolled_up, locked=True)
