"""Storing a step's model reply (the second half of ``chorus.step``).

The reply is stored only if the step's copy still owns it: its lease, at
its cursor position. A batch of tools to run on a job's own turn is stored
by :func:`~orchestrator.store.step_sql.store_batch` (one statement where the
database can: :func:`_store_batch`); any other reply is a transaction that
locks the conversation first (:func:`_persist_owned`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any, NamedTuple

from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session

from orchestrator import registry
from orchestrator.engine.actions import Action, RunSegment, RunStep, ToolTask
from orchestrator.engine.budget import record_paid, record_usage, tool_calls_left
from orchestrator.engine.cursor import finish_turn, is_current, move_cursor
from orchestrator.engine.handoffs import answer_handoff
from orchestrator.engine.planning import update_plan
from orchestrator.engine.reply_meaning import (
    Finish,
    GiveUp,
    Handling,
    Nudge,
    PlannedCall,
    ReplyMeaning,
    RunCalls,
    StepFacts,
    ToolKind,
    answered_in_step,
    final_answer_errors,
    reply_meaning,
    spends_output_attempt,
)
from orchestrator.engine.structured_output import NUDGE, final_call
from orchestrator.engine.subagents import is_subagent_call, subagent_tool
from orchestrator.errors import UnknownAgentError, UnknownToolError
from orchestrator.events import ConversationIds, Outbox, TurnIds
from orchestrator.llm.call import ModelReply
from orchestrator.runtime import Runtime
from orchestrator.store.db import Db
from orchestrator.store.job_totals import lock_job, tree_params, tree_tool_calls
from orchestrator.store.rows import ConversationRow, TurnRow
from orchestrator.store.statements import NewRow, new_row_params
from orchestrator.store.step_sql import (
    Leased,
    owned_rows,
    release_owned,
    store_batch,
    store_calls,
    store_message,
    store_reply,
)
from orchestrator.store.tables import (
    Conversation,
    MessageRow,
    ToolCallRow,
    Turn,
    new_id,
    utcnow,
)
from schemas import (
    AgentSpec,
    EventName,
    TextBlock,
    ThinkingBlock,
    TurnStatus,
    Usage,
)
from schemas.content import ContentBlock
from schemas.specs import SUBAGENT_PREFIX

log = logging.getLogger(__name__)


def load_owned(
    session: Session, conversation_id: str, turn_id: str, step: int, owner: str
) -> tuple[Conversation, Turn, Turn] | None:
    """The conversation (its row locked), the turn and the job's turn, if
    ``owner`` holds the lease at ``step``."""
    # The conversation row first: the one lock order (docs/architecture.md)
    # that a stop follows too.
    found = owned_rows(session, conversation_id, turn_id)
    if found is None:
        return None
    conv, turn, job = found
    if not is_current(conv, turn_id, step, -1) or conv.lease_owner != owner:
        return None
    return conv, turn, job


def persist(
    rt: Runtime,
    ids: tuple[str, str, int],
    owner: str,
    reply: ModelReply,
    clocks: tuple[float, float],
    tools_allowed: bool,
    leased: tuple[ConversationRow, TurnRow, TurnRow, AgentSpec],
    offered: Collection[str],
) -> list[Action]:
    """``clocks``: monotonic times the model call and the step task began;
    ``leased``: what the step read as it took the lease, and the spec;
    ``offered``: the qualified names of the tools the step offered (a call
    to any other name is refused: :func:`~orchestrator.engine.access.refusal`)."""
    conversation_id, turn_id, step = ids
    conv, turn, job, spec = leased
    if tools_allowed and _one_statement(rt, spec, reply, (conv, turn, job)):
        return _store_batch(rt, ids, owner, reply, clocks, (conv, turn, spec), offered)
    actions = _persist_owned(
        rt, conversation_id, turn_id, step, owner, reply, clocks, tools_allowed, offered
    )
    if actions is None:  # the lease was lost or the cursor moved while the model ran
        record_superseded(rt, conversation_id, turn_id, step, reply)
        return []
    return actions


def _persist_owned(
    rt: Runtime,
    conversation_id: str,
    turn_id: str,
    step: int,
    owner: str,
    reply: ModelReply,
    clocks: tuple[float, float],
    tools_allowed: bool,
    offered: Collection[str],
) -> list[Action] | None:
    """Store the reply if this copy still owns the step; None if it does not."""
    with rt.transaction() as (session, outbox):
        loaded = load_owned(session, conversation_id, turn_id, step, owner)
        if loaded is None:
            return None
        conv, turn, job = loaded
        spec = AgentSpec.model_validate(conv.agent_spec)
        errors = final_answer_errors(spec, reply)
        spent = spends_output_attempt(spec, reply, errors, tools_allowed)
        attempts = turn.output_attempts
        left = _tool_calls_left(session, conv, job)
        facts = StepFacts(
            tools_allowed,
            offered,
            _kinds(reply, offered),
            left,
            rt.settings.max_reply_tool_calls,
            attempts,
        )
        meaning = reply_meaning(spec, reply, errors, facts)
        runs = meaning.counted if isinstance(meaning, RunCalls) else 0
        totals = _add_usage(session, outbox, conv, (turn, job), step, reply, clocks, runs)
        if spent:  # the turn's row (locked after the conversation's: the one order)
            turn.output_attempts = attempts + 1
        actions = _apply(session, outbox, (conv, turn), meaning, step, totals)
        if actions is None:  # another copy moved the cursor first
            outbox.discard()
            session.rollback()
            return None
    log.info(
        "step %d: model answered with %d tool calls (%s)",
        step,
        len(reply.tool_calls),
        type(meaning).__name__,
    )
    return actions


def _tool_calls_left(session: Session, conv: Conversation, job: Turn) -> int | None:
    """Tool calls the job may still make (None: unlimited), read under the
    root conversation's row lock, which every writer of the job's totals
    holds: two steps of one tree storing calls at once (a fan-out's
    children) cannot both spend the last ones. The job's totals read with
    the step's own row (:func:`load_owned`) may predate a write that
    committed while that statement waited for its lock; a statement after
    the lock sees it. On the root that row is the step's own, held already;
    elsewhere it is taken here, before any turn's row (the one lock order)."""
    if tool_calls_left(job) is None:  # no tool-call budget: nothing to count
        return None
    if conv.id != conv.root_id:
        lock_job(session, job.id)
    used = tree_tool_calls(session, job.id)
    set_committed_value(job, "tree_tool_calls", used)
    return tool_calls_left(job)


def record_superseded(
    rt: Runtime,
    conversation_id: str,
    turn_id: str,
    step: int,
    reply: ModelReply,
) -> None:
    """A reply that is not stored was still paid for: add its usage to the
    job's tree totals and say so in a ``usage`` event (``superseded``)."""
    with rt.transaction() as (session, outbox):
        conv = session.get(Conversation, conversation_id)
        turn = session.get(Turn, turn_id)
        if conv is None or turn is None:
            return
        record_paid(session, outbox, conv, turn, step, reply.usage, superseded=True)


def record_unstored(rt: Runtime, ids: tuple[str, str, int], owner: str, reply: ModelReply) -> None:
    """Storing a reply the provider answered failed: give the lease up and,
    if this copy still held it (storing a reply gives it up in the same
    commit, so the reply was not stored), add the call's usage to the
    job's tree totals and say so in a ``usage`` event (``unstored``): the
    provider was paid, and the step's retry calls it again. Best effort:
    the database may be what failed."""
    conversation_id, turn_id, step = ids
    try:
        with rt.transaction() as (session, outbox):
            # the conversation's row first: the one lock order
            if not release_owned(
                session, conversation_id, owner
            ):  # stored (that gave the lease up), or the lease was lost
                return
            conv = session.get(Conversation, conversation_id)
            turn = session.get(Turn, turn_id)
            assert conv is not None and turn is not None
            record_paid(session, outbox, conv, turn, step, reply.usage, unstored=True)
    except Exception:
        log.warning("step %d: could not record the usage of an unstored reply", step, exc_info=True)


def _add_usage(
    session: Session,
    outbox: Outbox,
    conv: Conversation,
    turns: tuple[Turn, Turn],
    step: int,
    reply: ModelReply,
    clocks: tuple[float, float],
    tool_calls: int,
) -> dict[str, Any]:
    """Store the assistant message and its usage, add the usage and the
    ``tool_calls`` that run to the job's tree totals; return the
    conversation's new totals. ``turns``: the turn and its job's turn.

    The turn's own usage and, for a job's own turn on its root
    conversation, the tree totals are one update of the turn's row: the
    conversation's row, locked first, is the root's, which orders every
    writer of the job's turn. Any other step takes the root's row
    (:func:`~orchestrator.store.job_totals.lock_job`) before it writes a turn:
    a job on a subagent's conversation writes its own turn and then the
    tree totals on that same turn, and a stop locks the root's row, then
    the job's turn."""
    turn, job = turns
    usage = reply.usage
    own = _usage_params(turn.id, step, usage)
    own.update(tree_params(usage, tool_calls))
    jobs_own = job.id == turn.id  # its usage and the tree totals: one update of the row
    # Core: the turn object keeps its loaded usage and totals (nothing
    # reads them after this); its step count is what the turn's end reads.
    # On Postgres the message's INSERT, and off the root the root's lock
    # and the roll-up, ride on the usage's UPDATE.
    message = _assistant_message(conv.id, turn.id, step, reply)
    store_reply(
        session, message, own, (job.id, jobs_own, conv.id == conv.root_id), (usage, tool_calls)
    )
    set_committed_value(turn, "steps", step + 1)
    _record_reply(outbox, conv, turn, step, reply, clocks)
    return {
        "input_tokens": conv.input_tokens + usage.input_tokens,
        "output_tokens": conv.output_tokens + usage.output_tokens,
        "cost_usd": conv.cost_usd + usage.cost_usd,
    }


def _assistant_message(
    conversation_id: str, turn_id: str, step: int, reply: ModelReply
) -> dict[str, Any]:
    """The values of the reply's assistant message row."""
    content: list[ContentBlock] = []
    if reply.thinking:
        content.append(ThinkingBlock(thinking=reply.thinking))
    if reply.text:
        content.append(TextBlock(text=reply.text))
    content.extend(reply.tool_calls)
    usage = reply.usage
    return {
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "step": step,
        "kind": "assistant",
        "role": "assistant",
        "content": [b.model_dump(mode="json") for b in content],
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": usage.cost_usd,
    }


def _usage_params(turn_id: str, step: int, usage: Usage) -> dict[str, Any]:
    """The parameters of the turn's own usage (:data:`ADD_USAGE`)."""
    return {
        "b_turn": turn_id,
        "b_steps": step + 1,
        "b_input": usage.input_tokens,
        "b_output": usage.output_tokens,
        "b_cost": usage.cost_usd,
    }


def _record_reply(
    outbox: Outbox,
    conv: ConversationIds,
    turn: TurnIds,
    step: int,
    reply: ModelReply,
    clocks: tuple[float, float],
) -> None:
    """The events of a stored reply: ``llm.completed`` (with the time to
    its first streamed token, None if nothing streamed), ``usage`` and
    ``assistant.message``. ``clocks``: when the model call and the step began."""
    model_began, step_began = clocks
    now = time.monotonic()
    first = reply.first_token_at
    outbox.record(
        EventName.LLM_COMPLETED,
        conv,
        turn,
        step,
        seconds=round(now - model_began, 4),
        step_seconds=round(now - step_began, 4),
        first_token_seconds=None if first is None else round(max(0.0, first - model_began), 4),
    )
    record_usage(outbox, conv, turn, step, reply.usage)
    outbox.record(
        EventName.ASSISTANT_MESSAGE,
        conv,
        turn,
        step,
        text=reply.text,
        tool_calls=len(reply.tool_calls),
    )


#: The most calls :func:`_store_batch` stores in one statement (20
#: parameters a call and 9 an event: about 2,500 for 64); a larger batch
#: is a transaction.
_ONE_STATEMENT_CALLS = 64


def _one_statement(
    rt: Runtime,
    spec: AgentSpec,
    reply: ModelReply,
    lease: Leased,
) -> bool:
    """Is the reply a batch of tools to run that :func:`_store_batch` can
    store? For a job's own turn on its root conversation (no other turn's
    row to lock first), no tool-call budget to check under
    the lock, no final answer to validate, no built-in call answered in
    the step, and not too many calls for one statement (nor for one reply:
    ``CHORUS_MAX_REPLY_TOOL_CALLS``)."""
    conv, turn, job = lease
    calls = len(reply.tool_calls)
    return (
        0 < calls <= min(_ONE_STATEMENT_CALLS, rt.settings.max_reply_tool_calls)
        and conv.id == conv.root_id
        and job.id == turn.id
        and tool_calls_left(job) is None
        and final_call(spec, reply.tool_calls) is None
        and not any(answered_in_step(spec, call.tool) for call in reply.tool_calls)
    )


def _kinds(reply: ModelReply, offered: Collection[str]) -> dict[str, ToolKind]:
    """What the registry says of the reply's called tools that the step
    offered (:data:`~orchestrator.engine.reply_meaning.ToolKind`): a
    registered tool's, or a subagent template's."""
    kinds: dict[str, ToolKind] = {}
    for call in reply.tool_calls:
        if call.tool not in offered or call.tool in kinds:
            continue
        try:
            tool = (
                subagent_tool(call.tool.removeprefix(SUBAGENT_PREFIX))
                if is_subagent_call(call.tool)
                else registry.get_tool(call.tool).spec
            )
        except (UnknownToolError, UnknownAgentError):
            continue
        kinds[call.tool] = (tool.parallelizable, tool.queue)
    return kinds


def _store_batch(
    rt: Runtime,
    ids: tuple[str, str, int],
    owner: str,
    reply: ModelReply,
    clocks: tuple[float, float],
    lease: tuple[ConversationRow, TurnRow, AgentSpec],
    offered: Collection[str],
) -> list[Action]:
    """Store a batch of tools to run (:func:`_one_statement`) with
    :func:`~orchestrator.store.step_sql.store_batch`: on Postgres one
    statement committed on its own. The rows are locked in the one order:
    the root conversation's, then the job's turn. What :func:`persist`
    stores in a transaction, in one round trip."""
    conversation_id, turn_id, step = ids
    conv, turn, spec = lease
    facts = StepFacts(True, offered, _kinds(reply, offered), None, rt.settings.max_reply_tool_calls)
    meaning = reply_meaning(spec, reply, None, facts)
    assert isinstance(meaning, RunCalls)  # see _one_statement
    outbox = Outbox()
    _record_reply(outbox, conv, turn, step, reply, clocks)
    usage = reply.usage
    params = {
        "b_conv": conversation_id,
        "b_step": step,
        "b_owner": owner,
        **_usage_params(turn_id, step, usage),
        **tree_params(usage, meaning.counted),
    }
    message = _assistant_message(conversation_id, turn_id, step, reply)
    with rt.guarded_write() as db:
        rows, tasks = _call_rows(db, outbox, (conv, turn), step, meaning)
        new: list[NewRow] = [(MessageRow, message), *((ToolCallRow, row) for row in rows)]
        params.update(new_row_params(new))
        stored = store_batch(db, outbox, params, len(rows))
    if not stored:  # the lease was lost or the cursor moved while the model ran
        record_superseded(rt, conversation_id, turn_id, step, reply)
        return []
    rt.publish(outbox)
    log.info("step %d: model answered with %d tool calls (RunCalls)", step, len(reply.tool_calls))
    return [RunSegment(conversation_id, turn_id, step, 0, tuple(tasks), conv.priority)]


def _apply(
    session: Session,
    outbox: Outbox,
    where: tuple[Conversation, Turn],
    meaning: ReplyMeaning,
    step: int,
    totals: dict[str, Any],
) -> list[Action] | None:
    """Store what the reply means (:func:`reply_meaning`) with the cursor's
    move; None if another copy moved the cursor first."""
    conv, turn = where
    match meaning:
        case RunCalls():
            return _record_calls(session, outbox, where, step, meaning, totals)
        case Nudge():
            return _nudge(session, conv, turn.id, step, totals)
        case Finish(output=output, structured=structured):
            if structured is not None:
                turn.structured = structured
            return finish_turn(
                session, outbox, conv, turn, TurnStatus.COMPLETED, output=output, **totals
            )
        case GiveUp(error=error):
            return finish_turn(
                session, outbox, conv, turn, TurnStatus.FAILED, error=error, **totals
            )


def _record_calls(
    session: Session,
    outbox: Outbox,
    where: tuple[Conversation, Turn],
    step: int,
    meaning: RunCalls,
    totals: dict[str, Any],
) -> list[Action] | None:
    """Store the tool calls, segment by segment, and return segment 0 to run
    (a refused call is stored with its error result; a plan or handoff
    call is answered here: :func:`_answer_here`)."""
    conv, turn = where
    if not move_cursor(
        session, conv, cursor_segment=0, lease_owner=None, lease_until=None, **totals
    ):
        return None
    rows, tasks = _call_rows(session, outbox, where, step, meaning)
    store_calls(session, rows)
    return [RunSegment(conv.id, turn.id, step, 0, tuple(tasks), conv.priority)]


class _CallAt(NamedTuple):
    """A call of a step's batch as its events name it
    (:class:`~orchestrator.events.CallIds`), before it has a row."""

    step: int
    tool: str
    tool_request_id: str


def _call_rows(
    db: Db,
    outbox: Outbox,
    where: tuple[Conversation, Turn] | tuple[ConversationRow, TurnRow],
    step: int,
    meaning: RunCalls,
) -> tuple[list[dict[str, Any]], list[ToolTask]]:
    """The rows of the batch's tool calls, with their events, and the
    tasks of segment 0."""
    conv, turn = where
    tasks: list[ToolTask] = []
    handed: list[str] = []  # the batch's handoff target, once one is accepted
    rows: list[dict[str, Any]] = []  # stored with one INSERT (Core: no ORM objects)
    for position, planned in enumerate(meaning.calls):
        call = planned.call
        row: dict[str, Any] = {
            "id": new_id(),
            "conversation_id": conv.id,
            "turn_id": turn.id,
            "step": step,
            "position": position,
            "segment": planned.segment,
            "tool_request_id": call.tool_request_id,
            "tool": call.tool,
            "params": call.params,
            "parallelizable": planned.parallelizable,
            "queue": planned.queue,
            "status": "pending",
            "result": None,  # JSON null, as the ORM stored it
            "is_error": False,
            "finished_at": None,
        }
        at = _CallAt(step, call.tool, call.tool_request_id)
        outbox.record_call(
            EventName.SUBAGENT_REQUESTED
            if is_subagent_call(call.tool)
            else EventName.TOOL_REQUESTED,
            conv,
            turn,
            at,
            params=call.params,
            segment=planned.segment,
            parallelizable=planned.parallelizable,
        )
        answer = _answer_here(db, outbox, where, planned, row, handed)
        if answer is not None:
            row["result"], row["is_error"] = answer
            row["status"] = "failed" if row["is_error"] else "completed"
            row["finished_at"] = utcnow()
            outbox.record_call(
                EventName.TOOL_FAILED if row["is_error"] else EventName.TOOL_COMPLETED,
                conv,
                turn,
                at,
                result=row["result"],
            )
        elif planned.segment == 0:
            tasks.append(ToolTask(row["id"], call.tool, planned.queue))
        rows.append(row)
    return rows, tasks


def _answer_here(
    db: Db,
    outbox: Outbox,
    where: tuple[Conversation, Turn] | tuple[ConversationRow, TurnRow],
    planned: PlannedCall,
    row: dict[str, Any],
    handed: list[str],
) -> tuple[Any, bool] | None:
    """The result of a call the step answers itself (a refusal, a plan
    update, a handoff), or None for a call to run. Only Chorus's own rows
    change, with the cursor's move: exactly once. ``row``: the call's
    column values (a transient row is made of them for the answering
    function; :func:`_call_rows` stores them)."""
    match planned.handling:
        case Handling.RUN:
            return None
        case Handling.REFUSE:
            assert planned.error is not None
            return planned.error, True
        case Handling.HAND_OFF:
            return answer_handoff(ToolCallRow(**row), handed)
        case Handling.UPDATE_PLAN:
            conv, turn = where
            # see _one_statement: a plan update is in a transaction, of the rows it locked
            assert (
                isinstance(conv, Conversation)
                and isinstance(turn, Turn)
                and isinstance(db, Session)
            )
            return update_plan(db, outbox, conv, turn, ToolCallRow(**row))


def _nudge(
    session: Session, conv: Conversation, turn_id: str, step: int, totals: dict[str, Any]
) -> list[Action] | None:
    """A text answer where a final answer is required: ask again."""
    if not move_cursor(
        session,
        conv,
        cursor_step=step + 1,
        cursor_segment=-1,
        lease_owner=None,
        lease_until=None,
        **totals,
    ):
        return None
    store_message(
        session,
        {
            "conversation_id": conv.id,
            "turn_id": turn_id,
            "step": step,
            "kind": "nudge",
            "role": "user",
            "content": [TextBlock(text=NUDGE).model_dump()],
        },
    )
    return [RunStep(conv.id, turn_id, step + 1, conv.priority)]
