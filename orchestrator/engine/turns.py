"""Starting a turn: validate, store the input, point the cursor at step 0."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from orchestrator import registry
from orchestrator.context import transformer
from orchestrator.engine.actions import Action, Deadline, RunStep
from orchestrator.engine.checkpoint import strategy_of
from orchestrator.engine.conversations import load_idle
from orchestrator.engine.cursor import move_cursor
from orchestrator.errors import ConversationBusyError, InvalidRequestError, UnknownAgentError
from orchestrator.policies import check_policies
from orchestrator.runtime import Runtime
from orchestrator.settings import Settings
from orchestrator.spec_checks import check_inline, check_spec
from orchestrator.store.conversation_sql import first_message, new_conversation, turn_by_key
from orchestrator.store.statements import NewRow, insert_new
from orchestrator.store.tables import Conversation, MessageRow, Turn, new_id, utcnow
from orchestrator.store.values import check
from schemas import AgentSpec, Budget, ConversationState, EventName, JobRequest
from schemas.jobs import MAX_CONTEXT_BYTES


@dataclass(frozen=True)
class JobRef:
    """Identity of a started (or found) turn: the job's handle."""

    job_id: str
    conversation_id: str
    root_id: str


def resolve_agent(agent: str | AgentSpec) -> AgentSpec:
    """The registered agent of that name, or an inline spec, once everything
    it names exists (tools, subagents, handoff targets, context
    transformers, checkpoint strategy, policies, in it and in the agents it
    names) and its settings pass
    :func:`~orchestrator.spec_checks.check_spec`: a spec that would fail every
    step is refused here, at submit."""
    spec = registry.get_agent(agent) if isinstance(agent, str) else agent
    _check_tree(spec, set())
    return spec


def _check_tree(spec: AgentSpec, seen: set[str]) -> None:
    seen.add(spec.name)
    check_spec(spec)
    registry.check_agent(spec)
    if not registry.only_published(spec):  # else the workers checked these
        check_policies(spec.policies)
        for name in spec.context:
            transformer(spec, name)
        strategy_of(spec)
    for name in (*spec.subagents, *spec.handoffs):
        if name not in seen:
            _check_tree(registry.get_agent(name), seen)


def check_inline_agent(settings: Settings, agent: str | AgentSpec) -> None:
    """An inline spec (one that is not the registered agent of its name)
    may not say where its model calls go: :func:`~orchestrator.spec_checks.check_inline`
    with ``CHORUS_MODEL_ENDPOINTS``. A registered agent is the workers' own
    configuration and passes."""
    if isinstance(agent, str):
        return
    try:
        if registry.get_agent(agent.name) == agent:
            return
    except UnknownAgentError:
        pass
    check_inline(agent, settings.model_endpoints)


def check_input(settings: Settings, text: str, field: str) -> None:
    """Job input (or a sent message): storable, within CHORUS_MAX_INPUT_CHARS."""
    if not isinstance(text, str):
        raise InvalidRequestError(f"{field}: a string is required", [field])
    if not text or len(text) > settings.max_input_chars:
        raise InvalidRequestError(
            f"{field}: {len(text)} characters; between 1 and {settings.max_input_chars} "
            "are accepted (CHORUS_MAX_INPUT_CHARS)",
            [field],
        )
    check(text, field)


def _check_request(settings: Settings, request: JobRequest) -> None:
    """Everything the request would store, before anything is stored."""
    check_input(settings, request.input, "input")
    check(request.conversation_id, "conversation_id")
    check(request.idempotency_key, "idempotency_key")
    check_job_data(request.context_data, request.budget)


def check_job_data(context_data: dict[str, Any] | None, budget: Budget | None) -> None:
    """A job's (or a sent message's) ``context_data`` and budget: storable,
    ``context_data`` within :data:`~schemas.jobs.MAX_CONTEXT_BYTES`."""
    check(budget, "budget")
    check(context_data, "context_data")
    size = len(json.dumps(context_data))
    if size > MAX_CONTEXT_BYTES:
        raise InvalidRequestError(
            f"context_data is {size} bytes of JSON; the limit is {MAX_CONTEXT_BYTES}",
            ["context_data"],
        )


def _existing(session: Session, key: str | None) -> JobRef | None:
    if key is None:
        return None
    found = turn_by_key(session, key)
    return JobRef(found.id, found.conversation_id, found.root_id) if found else None


class _Ids(NamedTuple):
    """The ids an event names of a row stored here without an ORM object
    (see :class:`~orchestrator.events.ConversationIds` and ``TurnIds``)."""

    id: str
    root_id: str
    correlation_id: str


def start_turn(
    rt: Runtime, request: JobRequest, *, queued_entry: str | None = None
) -> tuple[JobRef, list[Action]]:
    """Store the user's input as a new turn and return the step to run.

    Submitting again with the same idempotency key returns the first turn
    and starts nothing. ``queued_entry`` names the queued message this turn
    takes (recorded as ``message.dequeued``).

    The rows are written with pre-built Core INSERTs (no ORM object is read
    back): a new conversation is inserted already running its first turn,
    as nothing else can see it before the commit; an existing one is moved
    by the compare-and-set of :func:`~orchestrator.engine.cursor.move_cursor`
    after the turn's rows, as before.
    """
    spec = resolve_agent(request.agent)
    if queued_entry is None:  # a queued message was checked when it was sent (a
        _check_request(rt.settings, request)  # worker's lower cap must not drop it)
        check_inline_agent(rt.settings, request.agent)  # and runs its conversation's spec
    budget = request.budget or spec.budget
    agent_spec = spec.model_dump(mode="json")
    try:
        with rt.transaction() as (session, outbox):
            found = _existing(session, request.idempotency_key)
            if found:
                return found, []
            turn_id = new_id()
            conv, number, new = _claim_conversation(session, request, turn_id, agent_spec)
            turn = _Ids(turn_id, conv.root_id, new_id())
            insert_new(session, *new, *_turn_rows(request, spec.name, budget, conv, turn, number))
            if isinstance(conv, Conversation) and not move_cursor(
                session,
                conv,
                state=ConversationState.RUNNING.value,
                turn_id=turn.id,
                cursor_step=0,
                cursor_segment=-1,
                turns=number + 1,
                agent=spec.name,
                agent_spec=agent_spec,
                priority=request.priority,
            ):
                raise ConversationBusyError(conv.id)
            outbox.record(
                EventName.TURN_STARTED,
                conv,
                turn,
                step=0,
                agent=spec.name,
                input=request.input,
            )
            if queued_entry is not None:
                outbox.record(EventName.MESSAGE_DEQUEUED, conv, turn, 0, entry=queued_entry)
    except IntegrityError:
        # Lost a race on the idempotency key: the winner's turn is the job.
        with rt.session() as session:
            found = _existing(session, request.idempotency_key)
        if found is None:
            raise
        return found, []
    ref = JobRef(turn.id, conv.id, conv.root_id)
    actions: list[Action] = [RunStep(conv.id, turn.id, 0, request.priority)]
    if budget is not None and budget.wall_seconds is not None:
        # A task held for longer than the visibility timeout is delivered
        # again; a deadline further away is looked at once on the way.
        wait = min(budget.wall_seconds, rt.settings.visibility_timeout / 2)
        actions.append(Deadline(turn.id, wait, request.priority))
    return ref, actions


def _claim_conversation(
    session: Session, request: JobRequest, turn_id: str, agent_spec: dict[str, Any]
) -> tuple[Conversation | _Ids, int, list[NewRow]]:
    """The conversation the turn runs in, the turn's number in it, and the
    conversation's row if it is new.

    An existing one must be idle (its cursor is then moved by compare-and-set);
    a new one is inserted as it is once its first turn started, which is
    what an insert followed by that move would leave."""
    if request.conversation_id is not None:
        conv = load_idle(session, request.conversation_id)
        return conv, conv.turns, []
    now = utcnow()
    row = new_conversation(
        None,
        agent_spec,
        created_at=now,
        progress_at=now,
        state=ConversationState.RUNNING.value,
        turn_id=turn_id,
        cursor_step=0,
        cursor_segment=-1,
        version=1,
        turns=1,
        priority=request.priority,
        tenant=request.tenant,
    )
    return _Ids(row["id"], row["id"], ""), 0, [(Conversation, row)]


def _turn_rows(
    request: JobRequest,
    agent: str,
    budget: Budget | None,
    conv: Conversation | _Ids,
    turn: _Ids,
    number: int,
) -> list[NewRow]:
    """The turn's row and its input message's (the job of a top-level turn is itself)."""
    now = utcnow()
    return [
        (
            Turn,
            {
                "id": turn.id,
                "conversation_id": conv.id,
                "root_id": conv.root_id,
                "number": number,
                "agent": agent,
                "input_text": request.input,
                "context_data": request.context_data,
                "idempotency_key": request.idempotency_key,
                "correlation_id": turn.correlation_id,
                "job_id": turn.id,
                "budget": budget.model_dump(mode="json") if budget else None,
                "started_at": now,
            },
        ),
        (MessageRow, {**first_message(conv.id, turn.id, request.input), "created_at": now}),
    ]
