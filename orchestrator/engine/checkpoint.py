"""Checkpoints: summarize a conversation so later prompts stay small.

A checkpoint runs an ephemeral child conversation (``kind="checkpoint"``)
that asks the agent's model for a briefing of the history up to a boundary
(the system prompt and any earlier summary included), then stores
{boundary message id, summary}. The ``checkpoint`` context transformer
replaces everything up to the boundary with the summary; Postgres keeps
every original message. The prompt is built by a strategy, registered by
name (:func:`checkpoint_strategy`; the agent's ``checkpoint_strategy``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sqlmodel import Session

from orchestrator.engine.actions import Action, TakeCheckpoint
from orchestrator.engine.budget import record_paid
from orchestrator.engine.callpolicies import checkpoint_call, rate_limits
from orchestrator.engine.history import latest_checkpoint, load_rows, row_to_message
from orchestrator.errors import ConversationNotFound, InvalidRequestError
from orchestrator.events import Outbox
from orchestrator.policies import Defer
from orchestrator.policies.chain import after_model, policies_of
from orchestrator.ratelimit import RateLimited, request_tokens
from orchestrator.runtime import Runtime
from orchestrator.store.conversation_sql import (
    NewConversation,
    first_message,
    new_conversation,
    start_conversation,
)
from orchestrator.store.job_totals import add_usage, lock_job
from orchestrator.store.tables import CheckpointRow, Conversation, MessageRow, Turn
from schemas import (
    AgentSpec,
    EventName,
    Message,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    Usage,
)
from schemas.jobs import DEFAULT_PRIORITY

Strategy = Callable[[AgentSpec, str | None, list[Message]], list[dict[str, str]]]
_strategies: dict[str, Strategy] = {}

#: Message kinds after which the history can be cut (no tool call is left open).
_CUTS = {"input", "tool_results", "nudge", "loaded"}


def checkpoint_strategy(name: str) -> Callable[[Strategy], Strategy]:
    """Register a strategy: (agent, earlier summary, messages) -> summarizer prompt."""

    def register(fn: Strategy) -> Strategy:
        _strategies[name] = fn
        return fn

    return register


def strategy_of(agent: AgentSpec) -> Strategy:
    """The agent's checkpoint strategy; raises
    :class:`~orchestrator.errors.InvalidRequestError` if none is registered."""
    try:
        return _strategies[agent.checkpoint_strategy]
    except KeyError:
        raise InvalidRequestError(
            f"agent {agent.name!r} names an unknown checkpoint strategy "
            f"{agent.checkpoint_strategy!r}; registered: {sorted(_strategies)}",
            ["checkpoint_strategy"],
        ) from None


def _render(message: Message) -> str:
    parts = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolCallBlock):
            parts.append(f"[calls {block.tool}({json.dumps(block.params)})]")
        elif isinstance(block, ToolResultBlock):
            parts.append(f"[{block.tool} returned: {json.dumps(block.result)}]")
    return f"{message.role.value}: " + " ".join(parts)


@checkpoint_strategy("briefing")
def briefing(
    agent: AgentSpec, earlier: str | None, messages: list[Message]
) -> list[dict[str, str]]:
    """Ask for a briefing another assistant could continue from."""
    parts = [f"The assistant's instructions:\n{agent.system or '(none)'}"]
    if earlier:
        parts.append(f"Briefing of what came before:\n{earlier}")
    parts.append("Conversation:\n" + "\n".join(_render(m) for m in messages))
    return [
        {
            "role": "system",
            "content": "Write a briefing of the conversation below for an assistant who "
            "will continue it with no other context: the user's goals and latest request, "
            "facts and tool results that matter, decisions made, open questions. Be "
            "complete and concise.",
        },
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _boundary(rows: list[MessageRow], after: int) -> MessageRow | None:
    """The last message after ``after`` where the history can be cut; the
    request being answered (a trailing input) stays verbatim."""
    if rows and rows[-1].kind == "input":
        rows = rows[:-1]
    candidates = [
        r
        for r in rows
        if (r.id or 0) > after
        and (
            r.kind in _CUTS
            or (r.kind == "assistant" and not any(b.get("type") == "tool_call" for b in r.content))
        )
    ]
    return candidates[-1] if candidates else None


def _add_usage(
    session: Session, outbox: Outbox, conv: Conversation, turn: Turn, usage: Usage
) -> None:
    """The summarizer's call is paid like a step's: its usage goes to the
    conversation, the turn and the job's tree (a model call of the job's
    ``steps`` budget), with a ``usage`` event. Locks in the one order: the
    conversation, the job's root row, the turn, the job's turn."""
    add_usage(session, Conversation, conv.id, usage)
    lock_job(session, turn.job_id or turn.id)
    add_usage(session, Turn, turn.id, usage)
    record_paid(session, outbox, conv, turn, turn.steps, usage, checkpoint=True)


def _turn_of(summarizer_id: str) -> str:
    """The ``turn_id`` of a summarizer's messages (it runs no turn)."""
    return f"checkpoint:{summarizer_id}"


def take_checkpoint(rt: Runtime, conversation_id: str) -> bool:
    """Summarize the conversation up to its latest clean boundary.

    Returns False when nothing new can be summarized. The summarizer's call
    is admitted by the agent's rate limits: over one, raises
    :class:`~orchestrator.ratelimit.RateLimited` and stores nothing. A model
    failure raises :class:`~orchestrator.errors.ModelError` and stores
    nothing.
    """
    rt.model.warm()  # before admission: an admitted call is sent at once, not after imports
    with rt.transaction() as (session, outbox):
        conv = session.get(Conversation, conversation_id)
        turn = session.get(Turn, conv.turn_id) if conv and conv.turn_id else None
        if conv is None or turn is None:
            raise ConversationNotFound(conversation_id)
        agent = AgentSpec.model_validate(conv.agent_spec)
        strategy = strategy_of(agent)
        previous = latest_checkpoint(session, conv.id)
        after = previous.boundary_message_id if previous else 0
        rows = load_rows(session, conv.id, after)
        boundary = _boundary(rows, after)
        if boundary is None or boundary.id is None:
            return False
        included = [row_to_message(r) for r in rows if (r.id or 0) <= boundary.id]
        prompt = strategy(agent, previous.summary if previous else None, included)
        ids = (turn.id, turn.context_data)
        call = checkpoint_call(agent, conv.id, ids, turn.steps, prompt)
        limits = rate_limits(rt, request_tokens(call.messages))
        admitted = limits.before_model(call)
        if isinstance(admitted, Defer):  # nothing stored yet
            raise RateLimited(admitted.seconds)
        values = new_conversation(conv, agent.model_dump(mode="json"), kind="checkpoint")
        summarizer = NewConversation(
            values,
            message=first_message(values["id"], _turn_of(values["id"]), prompt[-1]["content"]),
        )
        start_conversation(session, summarizer)
        outbox.record(
            EventName.CHECKPOINT_STARTED,
            conv,
            turn,
            turn.steps,
            boundary_message_id=boundary.id,
            summarizer_conversation_id=summarizer.id,
        )
        boundary_id = boundary.id

    reply = rt.model.complete(call.model, call.messages, None, call.settings)
    limits.after_model(call, reply)
    after_model(policies_of(agent), call, reply)

    with rt.transaction() as (session, outbox):
        usage = reply.usage
        session.add(
            MessageRow(
                conversation_id=summarizer.id,
                turn_id=_turn_of(summarizer.id),
                step=0,
                kind="assistant",
                role="assistant",
                content=[TextBlock(text=reply.text).model_dump()],
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=usage.cost_usd,
            )
        )
        session.add(
            CheckpointRow(
                conversation_id=conversation_id,
                boundary_message_id=boundary_id,
                summary=reply.text,
                summarizer_conversation_id=summarizer.id,
            )
        )
        _add_usage(session, outbox, conv, turn, usage)
        outbox.record(
            EventName.CHECKPOINT_COMPLETED,
            conv,
            turn,
            turn.steps,
            boundary_message_id=boundary_id,
            summary_chars=len(reply.text),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
        )
    return True


def run_checkpoint(rt: Runtime, conversation_id: str) -> list[Action]:
    """A checkpoint asked for by a client (task ``chorus.checkpoint``); over
    a rate limit it is sent again when the window has room."""
    try:
        take_checkpoint(rt, conversation_id)
    except RateLimited as limited:
        return [TakeCheckpoint(conversation_id, DEFAULT_PRIORITY, countdown=limited.wait)]
    return []
