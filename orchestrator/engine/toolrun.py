"""``chorus.tool``: run one tool call and record its result exactly once."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlmodel import Session

from orchestrator import registry, tracing
from orchestrator.engine.actions import Action, RunSegment, ToolTask
from orchestrator.engine.approvals import hold
from orchestrator.engine.callpolicies import tool_call, tool_policies, tool_refusal
from orchestrator.engine.cancel import cancel_watch
from orchestrator.engine.subagents import is_subagent_call, start_child
from orchestrator.engine.tool_outputs import READ_TOOL_OUTPUT, archives, read_output
from orchestrator.errors import ChorusError, InvalidRequestError
from orchestrator.events import Outbox
from orchestrator.logs import bind, redact
from orchestrator.policies import Defer, Policy, Stop, ToolCall
from orchestrator.policies.chain import after_tool, before_tool
from orchestrator.runtime import Runtime
from orchestrator.store.db import Db
from orchestrator.store.rows import CallRow, ConversationRow, TurnRow
from orchestrator.store.step_sql import release_lease
from orchestrator.store.subagent_sql import claim_call, read_call
from orchestrator.store.tables import CALL_FINISHED
from orchestrator.store.tool_call_sql import Claimed, claim, record_result, unclaim
from orchestrator.store.values import MAX_DEPTH, storable
from orchestrator.tools.calls import STOP_POLL, ToolContext, ToolStopped
from schemas import AgentSpec, EventName, TurnStatus

log = logging.getLogger(__name__)


#: Key the LLM adapter uses for arguments that were not a JSON object.
INVALID_ARGUMENTS = "__invalid_arguments__"


def _execute(call: ToolCall, ctx: ToolContext, should_stop: Callable[[], bool]) -> tuple[Any, bool]:
    """(result, is_error). Every failure becomes an error result the model sees."""
    try:
        if INVALID_ARGUMENTS in call.params:
            raise InvalidRequestError(
                f"invalid arguments for tool {call.tool!r}: not a JSON object "
                f"nested at most {MAX_DEPTH} levels deep: "
                f"{str(call.params[INVALID_ARGUMENTS])[:500]}",
                ["arguments"],
            )
        return registry.get_tool(call.tool).invoke(call.params, ctx, should_stop), False
    except ChorusError as exc:
        return _error(exc), True
    except ToolStopped:
        raise  # the job is being stopped: no result at all
    except Exception as exc:  # a bug in validation itself must not kill the worker
        log.exception("tool %s failed unexpectedly", call.tool)
        return _error(f"{type(exc).__name__}: {exc}"), True


def _error(exc: Exception | str) -> str:
    """A failed call's result: its error, redacted as log lines are (it is
    stored, published in ``tool.failed`` and shown to the model)."""
    return f"Error: {redact(str(exc))}"


def _cap(result: Any, limit: int) -> Any:
    text = result if isinstance(result, str) else json.dumps(result)
    if len(text) <= limit:
        return result
    return text[:limit] + f"… [truncated {len(text) - limit} characters]"


def run_tool(
    rt: Runtime, call_id: str, task_id: str | None = None, subagent: bool = False
) -> list[Action]:
    """Run the call unless it already has a result (a redelivered copy), its
    turn has ended or its job is being stopped. The claim and the result are
    conditional updates: a copy that finds the call finished leaves (and
    returns like any other, so a chord still counts it), and each call has
    exactly one result. A subagent call starts its child conversation
    instead and returns the child's first step. A running tool whose job
    is stopped leaves within ``STOP_POLL`` seconds, recording nothing.

    The claim is one statement committed on its own (it reads the call, its
    turn, its job's stop mark and its conversation as it claims); the
    result is one statement too, storing the result's event and the call's
    ``tool.started`` (carrying the claim's time) only if the result took.

    ``subagent``: the dispatcher's word that the call names a subagent, so
    the claim of a tool run (which never takes such a call) is skipped; a
    call that turns out not to name one is claimed as usual."""
    claimed = None if subagent else _claim(rt, call_id, task_id)
    if claimed is None:
        child = _start_subagent(rt, call_id, task_id)
        if child is not None or not subagent:
            return child or []
        claimed = _claim(rt, call_id, task_id)
        if claimed is None:
            return []
    call, turn, conv = claimed
    _bind(call, turn, conv)
    spec = AgentSpec.model_validate(conv.agent_spec)
    if hold(rt, spec, claimed):
        return []  # waits for a person's answer, holding no slot (engine/approvals.py)
    policies = tool_policies(spec)
    refused, run = _admitted(rt, spec, policies, claimed)
    if isinstance(run, Defer):
        return _deferred(rt, claimed, run.seconds)
    if refused is not None:  # never run a tool the agent was not given, nor one past its runs
        with rt.transaction() as (session, outbox):
            _store_result(session, outbox, call, turn, conv, refused, True)
        return []
    started = Outbox()
    started.record_call(
        EventName.TOOL_STARTED,
        conv,
        turn,
        call,
        attempt=call.attempts,
    )
    ctx = ToolContext(
        conversation_id=conv.id,
        root_id=conv.root_id,
        turn_id=turn.id,
        # the call's own row id, not the provider's id (which may repeat):
        # unique per call and the same for every copy of its task
        tool_request_id=call.id,
        context_data=dict(turn.context_data),
    )
    try:
        with tracing.tool_call(call, (conv.id, turn.id)) as span:
            if call.tool == READ_TOOL_OUTPUT:
                result, is_error = _read(rt, conv, call, spec.tool_output_limit)
            else:
                should_stop = cancel_watch(rt, turn.correlation_id, STOP_POLL)
                result, is_error = _execute(run, ctx, should_stop)
            span.result(result, is_error)
    except ToolStopped:
        log.info("tool %s stopped: its job is being stopped", call.tool)
        return []
    after_tool(policies, run, result, is_error)
    log.info("tool %s %s (attempt %d)", call.tool, "failed" if is_error else "done", call.attempts)
    result = _cap(storable(result), rt.settings.max_tool_result_chars)
    limit = spec.tool_output_limit
    view_chars = limit if archives(call.tool, result, limit) else None

    # the result and its events, tool.started too, only if the result took
    # (another copy may have finished it): on Postgres one statement
    _record_completion(started, call, turn, conv, result, is_error, view_chars)
    with rt.guarded_write() as db:
        stored = record_result(db, call.id, (result, is_error, view_chars), started)
    if stored:
        rt.publish(started)
    return []


def _admitted(
    rt: Runtime, spec: AgentSpec, policies: Sequence[Policy], claimed: Claimed
) -> tuple[str | None, ToolCall | Defer]:
    """The call as it runs (its params as the policies rewrote them), and
    the error result instead of a run: a call past its runs, a tool the
    agent was not given (the built-in tool-access policy) or one another
    policy refused (else None)."""
    call, turn, conv = claimed
    run = tool_call(spec, call, (turn.id, turn.context_data), conv.id)
    refused = _exhausted(rt, call)
    if refused is not None:
        return refused, run
    policy, decided = before_tool(policies, run)
    if isinstance(decided, Stop):
        return tool_refusal(policy, decided), run
    if isinstance(decided, Defer):
        log.info("tool %s: policy %r defers it %.3f s", call.tool, policy, decided.seconds)
    return None, decided


def _deferred(rt: Runtime, claimed: Claimed, seconds: float) -> list[Action]:
    """A policy deferred the call: give the claim back (its run not
    counted) and send it again alone, with its segment's advance, in
    ``seconds``. This task ends now: no worker slot waits, and its chord
    part counts as returned (the advance it joins finds the call
    unfinished and leaves; the deferred call's own advance moves on)."""
    call, turn, conv = claimed
    with rt.autocommit() as connection:
        return _send_again(connection, call, (conv.id, turn.id), seconds)


def _send_again(db: Db, call: CallRow, where: tuple[str, str], seconds: float) -> list[Action]:
    """Give the call's claim back (:func:`unclaim`) and send it again, alone
    with its segment's advance, in ``seconds``; record when it is due, so
    the sweeper does not take a deferral longer than the stall timeout for
    a stalled turn (the cursor waits at the call's segment: no step holds a
    lease to release). ``where``: its conversation and turn."""
    found = unclaim(db, call.id)
    if found is None:  # finished meanwhile (a stop)
        return []
    segment, queue, priority = found
    conversation_id, turn_id = where
    release_lease(db, conversation_id, due_in=seconds)
    task = ToolTask(call.id, call.tool, queue)
    return [RunSegment(conversation_id, turn_id, call.step, segment, (task,), priority, seconds)]


def _exhausted(rt: Runtime, call: CallRow) -> str | None:
    """The error result of a call claimed more than ``max_tool_attempts``
    times, or None. Each claim counts a run; a claim finding the call
    already running means the run before it never recorded its result: its
    process died (a tool that kills its process is redelivered at once by a
    prefork pool) or the result was lost. Past the bound the call is not run
    again: the model sees the error and the turn goes on."""
    died = call.attempts - 1
    if died < rt.settings.max_tool_attempts:
        return None
    log.warning("tool %s not run again: its process died %d times", call.tool, died)
    return (
        f"Error: tool {call.tool!r} was not run again: the tool's process died {died} "
        "times while running this call"
    )


def _bind(call: CallRow, turn: TurnRow, conv: ConversationRow) -> None:
    """Name the call in this task's log lines."""
    bind(
        conversation_id=conv.id,
        root_id=conv.root_id,
        turn_id=turn.id,
        correlation_id=turn.correlation_id,
        step=call.step,
        tool=call.tool,
    )


def _claim(rt: Runtime, call_id: str, task_id: str | None) -> Claimed | None:
    """Mark the call running, unless it has its result, its turn has ended,
    its job is being stopped, or it is a subagent call: one conditional
    update committed on its own (:func:`orchestrator.store.tool_call_sql.claim`).
    Returns what the task reads of the call, its turn and its conversation."""
    with rt.autocommit() as connection:
        return claim(connection, call_id, task_id)


def _start_subagent(rt: Runtime, call_id: str, task_id: str | None) -> list[Action] | None:
    """Claim a subagent call and start its child, in one transaction (a
    claimed call always has its child or its error result). The call, its
    turn, its job's stop mark and its conversation are one read of the
    columns used (:func:`orchestrator.store.subagent_sql.read_call`).
    None: the call names no subagent."""
    with rt.transaction() as (session, outbox):
        found = read_call(session, call_id)
        if found is None:
            return []
        call, turn, conv, job = found
        if not is_subagent_call(call.tool):
            return None
        if call.status in CALL_FINISHED or turn.status != TurnStatus.RUNNING.value:
            return []
        if job.stop_status is not None:
            return []  # the job is being stopped: the stop records this call cancelled
        spec = AgentSpec.model_validate(conv.agent_spec)
        # The job's root row before the call's: the one lock order (a stop
        # ending the caller's turn locks its conversation, then its calls);
        # the child's start takes a slot on the job's turn under this lock.
        claimed = claim_call(session, call_id, task_id, turn.job_id or turn.id)
        if claimed is None:
            return []  # another copy finished it since the read above
        _bind(claimed, turn, conv)
        # the policies' before_tool (tool access first: never start a
        # subagent the agent was not given), in the claim's transaction
        run = tool_call(spec, claimed, (turn.id, turn.context_data), conv.id)
        policy, decided = before_tool(tool_policies(spec), run)
        if isinstance(decided, Stop):
            _store_result(session, outbox, claimed, turn, conv, tool_refusal(policy, decided), True)
            return []
        if isinstance(decided, Defer):  # given back in the claim's transaction
            return _send_again(session, claimed, (conv.id, turn.id), decided.seconds)
        claimed = claimed._replace(params=decided.params)
        with tracing.tool_call(claimed, (conv.id, turn.id), subagent=True):
            return _delegate(rt, session, outbox, claimed, (turn, conv, spec))


def _read(rt: Runtime, conv: ConversationRow, call: CallRow, limit: int) -> tuple[str, bool]:
    """A ``read_tool_output`` call: (its slice, or its error, and is_error)."""
    try:
        with rt.session() as session:
            return read_output(session, conv.root_id, call.params, limit), False
    except ValueError as exc:
        return _error(exc), True


def _store_result(
    session: Session,
    outbox: Outbox,
    call: CallRow,
    turn: TurnRow,
    conv: ConversationRow,
    result: Any,
    is_error: bool,
) -> bool:
    """Record the call's result and its event, unless it already has one
    (then False)."""
    if not record_result(session, call.id, (result, is_error, None)):
        return False
    _record_completion(outbox, call, turn, conv, result, is_error)
    return True


def _record_completion(
    outbox: Outbox,
    call: CallRow,
    turn: TurnRow,
    conv: ConversationRow,
    result: Any,
    is_error: bool,
    view_chars: int | None = None,
) -> None:
    """The call's ``tool.completed|failed``; an archived result's names its
    ``handle`` (for :meth:`orchestrator.Client.tool_output`)."""
    archived = {} if view_chars is None else {"handle": call.id}
    outbox.record_call(
        EventName.TOOL_FAILED if is_error else EventName.TOOL_COMPLETED,
        conv,
        turn,
        call,
        result=result,
        **archived,
    )


def _delegate(
    rt: Runtime,
    session: Session,
    outbox: Outbox,
    call: CallRow,
    caller: tuple[TurnRow, ConversationRow, AgentSpec],
) -> list[Action]:
    """Start the child; a refused call (unknown subagent, bad arguments,
    depth or fan-out limit) is answered at once with an error result."""
    try:
        return start_child(rt, session, outbox, call, caller)
    except ChorusError as exc:
        turn, conv, _ = caller
        if record_result(session, call.id, (_error(exc), True, None)):
            outbox.record_call(
                EventName.SUBAGENT_FAILED,
                conv,
                turn,
                call,
                error=redact(str(exc)),
            )
        return []
