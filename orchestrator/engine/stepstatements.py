"""The statements of ``chorus.step`` (:mod:`orchestrator.engine.step`), built once.

They are executed with parameters (``b_…``): building one per call (column
comparisons, coercions, an aliased entity) and generating its cache key
cost more CPU than the database's work. Writes whose rows the step does not
read back go to the tables (Core), without ORM bookkeeping.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Update, bindparam, func, insert, or_, update
from sqlalchemy import select as select_columns
from sqlalchemy.orm import aliased
from sqlmodel import col, select

from orchestrator.engine.budget import TREE_TOTALS
from orchestrator.engine.output import FINAL_ANSWER
from orchestrator.store.tables import Conversation, MessageRow, ToolCallRow, Turn, table
from schemas import ConversationState

_CONVERSATIONS = table(Conversation)
_TURNS = table(Turn)
_MESSAGES = table(MessageRow)
_TOOL_CALLS = table(ToolCallRow)

_JOB = aliased(Turn, name="job")

#: The model-call lease (:func:`~orchestrator.engine.step._take_lease`).
_TAKE = (
    update(Conversation)
    .where(
        col(Conversation.id) == bindparam("b_conv"),
        col(Conversation.state) == ConversationState.RUNNING.value,
        col(Conversation.turn_id) == bindparam("b_turn"),
        col(Conversation.cursor_step) == bindparam("b_step"),
        col(Conversation.cursor_segment) == -1,
        or_(
            col(Conversation.lease_until).is_(None),
            col(Conversation.lease_until) < bindparam("b_now"),
            col(Conversation.lease_owner) == bindparam("b_owner"),
        ),
        col(Turn.id) == bindparam("b_turn"),
        col(Turn.conversation_id) == Conversation.id,
        col(_JOB.id) == func.coalesce(Turn.job_id, Turn.id),
        col(_JOB.stop_status).is_(None),
    )
    .values(lease_owner=bindparam("b_owner"), lease_until=bindparam("b_until"))
    .execution_options(synchronize_session=False)
)
TAKE_JOINED = _TAKE.returning(Conversation, Turn)
TAKE_ALONE = _TAKE.returning(Conversation)

#: The conversation and the turn, the conversation's row locked
#: (:func:`~orchestrator.engine.step._load_owned`).
OWNED = (
    select(Conversation, Turn)
    .where(
        col(Conversation.id) == bindparam("b_conv"),
        col(Turn.id) == bindparam("b_turn"),
        col(Turn.conversation_id) == Conversation.id,
    )
    .with_for_update(of=Conversation)
    .execution_options(populate_existing=True)
)

#: Rejected final answers plus nudges so far in a turn
#: (:func:`~orchestrator.engine.step._output_attempts`).
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

#: The turn's own usage of one model call (:func:`~orchestrator.engine.step._add_usage`).
_OWN_USAGE: dict[str, Any] = {
    "steps": bindparam("b_steps"),
    "input_tokens": _TURNS.c.input_tokens + bindparam("b_input"),
    "output_tokens": _TURNS.c.output_tokens + bindparam("b_output"),
    "cost_usd": _TURNS.c.cost_usd + bindparam("b_cost"),
}
ADD_USAGE = update(_TURNS).where(_TURNS.c.id == bindparam("b_turn")).values(_OWN_USAGE)
#: The same and, for a job's own turn, its tree totals: one update of the row.
ADD_USAGE_AND_TREE = ADD_USAGE.values(TREE_TOTALS)


@cache
def release(owned: bool, columns: frozenset[str]) -> Update:
    """The statement of :func:`~orchestrator.engine.step._release_lease`, built once per form: by
    owner or not, and which further ``columns`` it sets."""
    where = [_CONVERSATIONS.c.id == bindparam("b_conv")]
    if owned:
        where.append(_CONVERSATIONS.c.lease_owner == bindparam("b_owner"))
    values: dict[str, Any] = {c: bindparam(f"b_{c}") for c in sorted(columns)}
    return update(_CONVERSATIONS).where(*where).values(lease_owner=None, lease_until=None, **values)
