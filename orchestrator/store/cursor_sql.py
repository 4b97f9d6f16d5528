"""The conversation cursor's compare-and-set moves, as statements built once.

A move is an ``UPDATE … WHERE version = :v`` (:func:`move_by_version`) or
an update on the cursor's position itself (:func:`move_from_position`):
of racing copies exactly one moves it. A move may end the turn too, in the
same statement on Postgres. What a move means (a turn's end, its events,
the parent's answer) is :mod:`orchestrator.engine.cursor`'s.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import ColumnElement, Update, bindparam, exists, func, select, update
from sqlmodel import Session

from orchestrator.store.clock import db_now
from orchestrator.store.dialect import writes_in_ctes
from orchestrator.store.statements import run
from orchestrator.store.tables import Conversation, Turn, table, utcnow
from schemas import ConversationState


def move_by_version(
    session: Session,
    at: tuple[str, int],
    values: dict[str, Any],
    ending: tuple[str, dict[str, Any]] | None = None,
) -> bool:
    """Move the cursor of conversation ``at`` (its id and the version read)
    to ``values`` (plain values), if its version is still that one; with
    ``ending`` (a turn's id and the columns that end it), the turn is ended
    too, only if the cursor moved: in the same statement on Postgres (the
    move as a CTE: the conversation's row first, the one lock order).
    ``values`` should hold every column the move sets (:func:`progress`)."""
    conversation_id, version = at
    params = {"where_id": conversation_id, "where_version": version, **_set_params(values)}
    statement = _by_version(tuple(values))
    together = ending is not None and writes_in_ctes(session)
    if ending is not None:
        params.update({"end_turn_id": ending[0], **_set_params(ending[1])})
        if together:
            statement = _ending_by_version(tuple(values))
    if run(session, statement, params).rowcount != 1:
        return False
    if ending is not None and not together:
        run(session, _END_TURN, params)
    return True


def progress(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with what every move sets: the stall clock restarts, the
    sweeper's re-dispatch count, any deferral of the old position and its
    failed model calls (the retry count) are cleared."""
    return {
        "redispatches": 0,
        "step_failures": 0,
        "due_at": None,
        "progress_at": utcnow(),
        **values,
    }


def move_from_position(
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
    """The compare-and-set of :func:`move_from_position`: its statement (one
    object per set of columns) and its parameters."""
    turn_id, step, segment = position
    values = progress(values)
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
    """The move of :func:`move_by_version`, built once per set of columns."""
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
    """The move of :func:`move_from_position`, built once per set of columns."""
    return update(_CONVERSATION).where(*_AT_POSITION).values(_set(keys))


#: A turn's end: its status, output, error and time (the turn's id is
#: ``end_turn_id``: beside a move's ``where_id`` in :func:`move_by_version`).
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


@lru_cache(maxsize=64)
def _ending_by_version(keys: tuple[str, ...]) -> Update:
    """Postgres: :func:`_by_version`'s move as a CTE, and the turn's end
    only if it moved (the conversation's row first: the one lock order)."""
    moved = _by_version(keys).returning(_CONVERSATION.c.id).cte("moved")
    return _END_TURN.where(exists(select(moved.c.id)))
