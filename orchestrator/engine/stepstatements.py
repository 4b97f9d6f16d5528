"""The statements of ``chorus.step`` (:mod:`orchestrator.engine.step`), built once.

They are executed with parameters (``b_…``): building one per call (column
comparisons, coercions, an aliased entity) and generating its cache key
cost more CPU than the database's work. Writes whose rows the step does not
read back go to the tables (Core), without ORM bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Insert,
    Update,
    bindparam,
    exists,
    func,
    insert,
    or_,
    update,
)
from sqlalchemy import select as select_columns
from sqlalchemy.orm import aliased
from sqlmodel import col, select

from orchestrator.engine.budget import JOB_ROW_COLUMNS, LOCK_JOB, ROLL_UP, TREE_TOTALS, JobRow
from orchestrator.engine.output import FINAL_ANSWER
from orchestrator.engine.prebuilt import MESSAGE_VALUES, new_rows_if
from orchestrator.events import Riders
from orchestrator.store.clock import db_now
from orchestrator.store.tables import Conversation, MessageRow, ToolCallRow, Turn, table
from schemas import ConversationState

_CONVERSATIONS = table(Conversation)
_TURNS = table(Turn)
_MESSAGES = table(MessageRow)
_TOOL_CALLS = table(ToolCallRow)

_JOB = aliased(Turn, name="job")

_JOB_TURNS = _TURNS.alias("job")


class LeasedConversation(NamedTuple):
    """What a step reads of its conversation when it takes the lease."""

    id: str
    root_id: str
    agent_spec: dict[str, Any]
    turn_id: str
    cursor_step: int
    priority: int


class LeasedTurn(NamedTuple):
    """What a step reads of its turn when it takes the lease."""

    id: str
    correlation_id: str
    context_data: dict[str, Any]


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

#: The model-call lease (:func:`~orchestrator.engine.step._take_lease`).
_TAKE = (
    update(_CONVERSATIONS)
    .where(
        *_AT_STEP,
        or_(
            _CONVERSATIONS.c.lease_until.is_(None),
            _CONVERSATIONS.c.lease_until < db_now(),  # the database's clock, not the worker's
            _CONVERSATIONS.c.lease_owner == bindparam("b_owner"),
        ),
        _NOT_DEFERRED,
        _TURNS.c.id == bindparam("b_turn"),
        _TURNS.c.conversation_id == _CONVERSATIONS.c.id,
        _JOB_TURNS.c.id == func.coalesce(_TURNS.c.job_id, _TURNS.c.id),
        _JOB_TURNS.c.stop_status.is_(None),
    )
    .values(lease_owner=bindparam("b_owner"), lease_until=db_now(bindparam("b_lease")))
)
#: The columns of :class:`LeasedConversation`, :class:`LeasedTurn` and the
#: job's :class:`~orchestrator.engine.budget.JobRow`, in order (labelled:
#: the three tables share column names).
_LEASED = (
    *(_CONVERSATIONS.c[c].label(f"c_{c}") for c in LeasedConversation._fields),
    *(_TURNS.c[c].label(f"t_{c}") for c in LeasedTurn._fields),
    *(_JOB_TURNS.c[c].label(f"j_{c}") for c in JOB_ROW_COLUMNS),
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


def leased(row: Sequence[Any]) -> tuple[LeasedConversation, LeasedTurn, JobRow]:
    """A row of :data:`TAKE_JOINED` or :data:`LEASED`, split in three."""
    conv_end = len(LeasedConversation._fields)
    turn_end = conv_end + len(LeasedTurn._fields)
    return (
        LeasedConversation(*row[:conv_end]),
        LeasedTurn(*row[conv_end:turn_end]),
        JobRow(*row[turn_end:]),
    )


#: The conversation, the turn and the job's turn, the conversation's row
#: locked (:func:`~orchestrator.engine.persist.load_owned`).
OWNED = (
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

#: Rejected final answers plus nudges so far in a turn
#: (:func:`~orchestrator.engine.persist._output_attempts`).
ATTEMPTS = select_columns(
    select_columns(func.count())
    .select_from(_TOOL_CALLS)
    .where(_TOOL_CALLS.c.turn_id == bindparam("b_turn"), _TOOL_CALLS.c.tool == FINAL_ANSWER)
    .scalar_subquery()
    + select_columns(func.count())
    .select_from(_MESSAGES)
    .where(_MESSAGES.c.turn_id == bindparam("b_turn"), _MESSAGES.c.kind == "nudge")
    .scalar_subquery()
)

STORE_MESSAGE = insert(_MESSAGES)
STORE_CALLS = insert(_TOOL_CALLS)

#: The turn's own usage of one model call (:func:`~orchestrator.engine.persist._add_usage`).
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
    row is locked first (:data:`~orchestrator.engine.budget.LOCK_JOB`, a
    CTE the update's condition waits on, so it runs before the update
    touches the turn), and for a turn that is not the job's own (``tree``
    False) the job's tree totals (:data:`~orchestrator.engine.budget.ROLL_UP`)
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


#: A step that stores a batch of tools to run, on Postgres
#: (:func:`~orchestrator.engine.persist._store_batch`): the guard of its one
#: statement. It moves the cursor to the batch's first segment if this
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
    (:func:`~orchestrator.engine.prebuilt.new_row_params`), each written
    only if the move took (``moved``)."""

    def riders(moved: ColumnElement[bool]) -> tuple[Insert | Update, ...]:
        return (
            ADD_USAGE_AND_TREE.where(moved),
            new_rows_if(MessageRow, moved),
            new_rows_if(ToolCallRow, moved, calls),
        )

    return riders


@cache
def release(owned: bool, deferred: bool) -> Update:
    """The statement of :func:`~orchestrator.engine.step._release_lease`, built once per form: by
    owner or not, and whether it defers the step ``b_due_in`` seconds (the
    database's clock)."""
    where = [_CONVERSATIONS.c.id == bindparam("b_conv")]
    if owned:
        where.append(_CONVERSATIONS.c.lease_owner == bindparam("b_owner"))
    values: dict[str, Any] = {"due_at": db_now(bindparam("b_due_in"))} if deferred else {}
    return update(_CONVERSATIONS).where(*where).values(lease_owner=None, lease_until=None, **values)
