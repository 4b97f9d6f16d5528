"""The conversation cursor: compare-and-set moves and turn endings."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import ColumnElement, Update, bindparam, exists, func, select, update
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session

from orchestrator.engine.actions import Action, Dequeue
from orchestrator.engine.prebuilt import run
from orchestrator.engine.subagents import answer_parent
from orchestrator.events import Outbox
from orchestrator.store.clock import db_now
from orchestrator.store.tables import Conversation, Turn, table, utcnow
from schemas import ConversationState, EventName, TurnStatus

#: What every move resets: the sweeper's re-dispatch count, a deferral of
#: the old position and its failed model calls (the retry count).
_MOVED: dict[str, Any] = {"redispatches": 0, "step_failures": 0, "due_at": None}


def move_cursor(session: Session, conv: Conversation, **values: Any) -> bool:
    """``UPDATE … WHERE version = :v``: True for exactly one of any racing copies.

    A move is progress: the stall clock restarts, the sweeper's re-dispatch
    count, any deferral of the old position and its retry count are cleared. ``values`` are
    plain values (no SQL expressions); ``conv`` shows them once moved.
    """
    return _move(session, conv, values)


def _move(
    session: Session,
    conv: Conversation,
    values: dict[str, Any],
    ending: tuple[str, dict[str, Any]] | None = None,
) -> bool:
    """:func:`move_cursor`; with ``ending`` (a turn's id and the columns
    that end it), the turn is ended too, only if the cursor moved: in the
    same statement on Postgres (the move as a CTE: the conversation's row
    first, the one lock order)."""
    values = {**_MOVED, "progress_at": utcnow(), **values}
    params = {"where_id": conv.id, "where_version": conv.version, **_set_params(values)}
    statement = _by_version(tuple(values))
    together = ending is not None and session.get_bind().dialect.name == "postgresql"
    if ending is not None:
        params.update({"end_turn_id": ending[0], **_set_params(ending[1])})
        if together:
            statement = _ending_by_version(tuple(values))
    if run(session, statement, params).rowcount != 1:
        return False
    if ending is not None and not together:
        run(session, _END_TURN, params)
    for key, value in (*values.items(), ("version", conv.version + 1)):
        set_committed_value(conv, key, value)
    return True


def move_cursor_from(
    session: Session, conversation_id: str, position: tuple[str, int, int], **values: Any
) -> bool:
    """Move the cursor of a running conversation that is still at
    ``position`` (turn, step, segment), unless the turn's job is being
    stopped (then nothing more runs): a compare-and-set on the position
    itself, in one update (no read first). Of racing copies exactly one
    moves it: the others' update finds the position gone once the winner
    commits. ``values`` are plain values (no SQL expressions)."""
    statement, params = move_from(conversation_id, position, **values)
    return run(session, statement, params).rowcount == 1


def move_from(
    conversation_id: str, position: tuple[str, int, int], **values: Any
) -> tuple[Update, dict[str, Any]]:
    """The compare-and-set of :func:`move_cursor_from`: its statement (one
    object per set of columns) and its parameters."""
    turn_id, step, segment = position
    values = {**_MOVED, "progress_at": utcnow(), **values}
    params = {
        "where_id": conversation_id,
        "where_turn_id": turn_id,
        "where_step": step,
        "where_segment": segment,
        **_set_params(values),
    }
    return _by_position(tuple(values)), params


_CONVERSATION = table(Conversation)
_TURN = table(Turn)
_PROGRESS = "progress_at"


def _set(keys: tuple[str, ...]) -> dict[str, Any]:
    """The SET clause of a move: the version's step, then a bound value per
    key; the stall clock (``progress_at``) restarts on the database's clock,
    which the sweeper reads it by."""
    c = _CONVERSATION.c
    return {
        "version": c.version + 1,
        **{key: bindparam(f"set_{key}", type_=c[key].type) for key in keys},
        **({_PROGRESS: db_now()} if _PROGRESS in keys else {}),
    }


def _set_params(values: dict[str, Any]) -> dict[str, Any]:
    return {f"set_{key}": value for key, value in values.items() if key != _PROGRESS}


@lru_cache(maxsize=64)
def _by_version(keys: tuple[str, ...]) -> Update:
    """The move of :func:`move_cursor`, built once per set of columns."""
    c = _CONVERSATION.c
    return (
        update(_CONVERSATION)
        .where(c.id == bindparam("where_id"), c.version == bindparam("where_version"))
        .values(_set(keys))
    )


def _job_not_stopping() -> ColumnElement[bool]:
    """The job of the turn ``:where_turn_id`` is not being stopped."""
    turn, job = _TURN.alias(), _TURN.alias()
    job_id = (
        select(func.coalesce(turn.c.job_id, turn.c.id))
        .where(turn.c.id == bindparam("where_turn_id"))
        .scalar_subquery()
    )
    return ~exists().where(job.c.id == job_id, job.c.stop_status.is_not(None))


_AT_POSITION = (
    _CONVERSATION.c.id == bindparam("where_id"),
    _CONVERSATION.c.state == ConversationState.RUNNING.value,
    _CONVERSATION.c.turn_id == bindparam("where_turn_id"),
    _CONVERSATION.c.cursor_step == bindparam("where_step"),
    _CONVERSATION.c.cursor_segment == bindparam("where_segment"),
    _job_not_stopping(),
)


@lru_cache(maxsize=64)
def _by_position(keys: tuple[str, ...]) -> Update:
    """The move of :func:`move_cursor_from`, built once per set of columns."""
    return update(_CONVERSATION).where(*_AT_POSITION).values(_set(keys))


#: A turn's end: its status, output, error and time (the turn's id is
#: ``end_turn_id``: beside a move's ``where_id`` in :func:`_move`).
_END_TURN = (
    update(_TURN)
    .where(_TURN.c.id == bindparam("end_turn_id"))
    .values(
        {
            key: bindparam(f"set_{key}", type_=_TURN.c[key].type)
            for key in ("status", "output", "error", "finished_at")
        }
    )
)

_END_EVENTS = {
    TurnStatus.COMPLETED: EventName.TURN_COMPLETED,
    TurnStatus.FAILED: EventName.TURN_FAILED,
    TurnStatus.CANCELLED: EventName.TURN_CANCELLED,
}


@lru_cache(maxsize=64)
def _ending_by_version(keys: tuple[str, ...]) -> Update:
    """Postgres: :func:`_by_version`'s move as a CTE, and the turn's end
    only if it moved (the conversation's row first: the one lock order)."""
    moved = _by_version(keys).returning(_CONVERSATION.c.id).cte("moved")
    return _END_TURN.where(exists(select(moved.c.id)))


def finish_turn(
    session: Session,
    outbox: Outbox,
    conv: Conversation,
    turn: Turn,
    status: TurnStatus,
    *,
    output: str | None = None,
    error: str | None = None,
    notify_parent: bool = True,
    **values: Any,
) -> list[Action] | None:
    """End the turn and free the conversation; None if another copy moved first.

    Returns what runs next: a subagent's turn answers its parent's call and
    advances the parent (unless ``notify_parent`` is False, as when the
    whole tree is cancelled); a top-level turn lets the conversation's next
    queued message start. ``values`` are further conversation columns to
    set in the same update.
    """
    moved = {
        "state": ConversationState.IDLE.value,
        "cursor_segment": -1,
        "lease_owner": None,
        "lease_until": None,
        **values,
    }
    ended = {"status": status.value, "output": output, "error": error, "finished_at": utcnow()}
    answers = turn.parent_call_id is not None and notify_parent
    # a turn that answers its parent is ended now, with the move, where the
    # answer's flush wrote it; any other with the transaction's other changes
    if not _move(session, conv, moved, (turn.id, ended) if answers else None):
        return None
    if answers:
        for key, value in ended.items():
            set_committed_value(turn, key, value)
    else:
        for key, value in ended.items():
            setattr(turn, key, value)
        session.add(turn)
    data: dict[str, Any] = {"status": status.value}
    if output is not None:
        data["output"] = output
    if error is not None:
        data["error"] = error
    outbox.record(
        _END_EVENTS[status],
        conv,
        turn,
        step=turn.steps,
        **data,
    )
    if turn.parent_call_id is None:
        return [Dequeue(conv.id, if_waiting=True)]
    if not answers:
        return []
    return answer_parent(session, outbox, turn, status, output if output is not None else error)


def is_current(conv: Conversation | None, turn_id: str, step: int, segment: int) -> bool:
    """Does the cursor still point here? A stale task leaves quietly."""
    return (
        conv is not None
        and conv.state == ConversationState.RUNNING.value
        and conv.turn_id == turn_id
        and conv.cursor_step == step
        and conv.cursor_segment == segment
    )
