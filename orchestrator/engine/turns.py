"""Starting a turn: validate, store the input, point the cursor at step 0."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from orchestrator import registry
from orchestrator.context import transformer
from orchestrator.engine.actions import Action, Deadline, RunStep
from orchestrator.engine.checkpoint import strategy_of
from orchestrator.engine.conversations import load_idle
from orchestrator.engine.cursor import move_cursor
from orchestrator.errors import ConversationBusyError, InvalidRequestError
from orchestrator.runtime import Runtime
from orchestrator.settings import Settings
from orchestrator.specs import check_spec
from orchestrator.store.tables import Conversation, MessageRow, Turn
from orchestrator.store.values import check
from schemas import AgentSpec, ConversationState, EventName, JobRequest, TextBlock
from schemas.jobs import MAX_CONTEXT_BYTES


@dataclass(frozen=True)
class TurnRef:
    """Identity of a started (or found) turn: the job's handle."""

    job_id: str
    conversation_id: str
    root_id: str


def resolve_agent(agent: str | AgentSpec) -> AgentSpec:
    """The registered agent of that name, or an inline spec, once everything
    it names exists (tools, subagents, handoff targets, context
    transformers, checkpoint strategy, in it and in the agents it names) and its settings pass
    :func:`~orchestrator.specs.check_spec`: a spec that would fail every
    step is refused here, at submit."""
    spec = registry.get_agent(agent) if isinstance(agent, str) else agent
    _check_tree(spec, set())
    return spec


def _check_tree(spec: AgentSpec, seen: set[str]) -> None:
    seen.add(spec.name)
    check_spec(spec)
    registry.check_agent(spec)
    for name in spec.context:
        transformer(spec, name)
    strategy_of(spec)
    for name in (*spec.subagents, *spec.handoffs):
        if name not in seen:
            _check_tree(registry.get_agent(name), seen)


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
    check(request.budget, "budget")
    check(request.context_data, "context_data")
    size = len(json.dumps(request.context_data))
    if size > MAX_CONTEXT_BYTES:
        raise InvalidRequestError(
            f"context_data is {size} bytes of JSON; the limit is {MAX_CONTEXT_BYTES}",
            ["context_data"],
        )


def _existing(session: Session, key: str | None) -> TurnRef | None:
    if key is None:
        return None
    turn = session.exec(select(Turn).where(Turn.idempotency_key == key)).first()
    return TurnRef(turn.id, turn.conversation_id, turn.root_id) if turn else None


def start_turn(
    rt: Runtime, request: JobRequest, *, queued_entry: str | None = None
) -> tuple[TurnRef, list[Action]]:
    """Store the user's input as a new turn and return the step to run.

    Submitting again with the same idempotency key returns the first turn
    and starts nothing. ``queued_entry`` names the queued message this turn
    takes (recorded as ``message.dequeued``).
    """
    spec = resolve_agent(request.agent)
    if queued_entry is None:  # a queued message was checked when it was sent: a
        _check_request(rt.settings, request)  # worker's lower cap must not drop it
    try:
        with rt.transaction() as (session, outbox):
            found = _existing(session, request.idempotency_key)
            if found:
                return found, []
            conv = _claim_conversation(session, request.conversation_id, spec)
            turn = Turn(
                conversation_id=conv.id,
                root_id=conv.root_id,
                number=conv.turns,
                agent=spec.name,
                input_text=request.input,
                context_data=request.context_data,
                idempotency_key=request.idempotency_key,
            )
            turn.job_id = turn.id
            budget = request.budget or spec.budget
            turn.budget = budget.model_dump(mode="json") if budget else None
            session.add(turn)
            session.add(
                MessageRow(
                    conversation_id=conv.id,
                    turn_id=turn.id,
                    step=0,
                    kind="input",
                    role="user",
                    content=[TextBlock(text=request.input).model_dump()],
                )
            )
            if not move_cursor(
                session,
                conv,
                state=ConversationState.RUNNING.value,
                turn_id=turn.id,
                cursor_step=0,
                cursor_segment=-1,
                turns=conv.turns + 1,
                agent=spec.name,
                agent_spec=spec.model_dump(mode="json"),
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
    ref = TurnRef(turn.id, conv.id, conv.root_id)
    actions: list[Action] = [RunStep(conv.id, turn.id, 0, request.priority)]
    if budget is not None and budget.wall_seconds is not None:
        # A task held for longer than the visibility timeout is delivered
        # again; a deadline further away is looked at once on the way.
        wait = min(budget.wall_seconds, rt.settings.visibility_timeout / 2)
        actions.append(Deadline(turn.id, wait, request.priority))
    return ref, actions


def _claim_conversation(
    session: Session, conversation_id: str | None, spec: AgentSpec
) -> Conversation:
    if conversation_id is None:
        conv = Conversation(agent=spec.name, root_id="")
        conv.root_id = conv.id
        conv.agent_spec = spec.model_dump(mode="json")
        session.add(conv)
        session.flush()
        return conv
    return load_idle(session, conversation_id)
