"""A subagent's answer as its parent's policies see it: their ``after_tool``
hooks, run by ``chorus.advance`` outside any transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row

from orchestrator.engine.callpolicies import tool_call, tool_policies
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.policies.chain import after_tool
from orchestrator.runtime import Runtime
from orchestrator.store.subagent_sql import has_child, read_call
from schemas import AgentSpec


def has_answers(calls: Sequence[Row[Any]], segment: int) -> bool:
    """Is a call of ``segment`` a subagent's (:func:`observe_answers`)?"""
    return any(c.segment == segment and is_subagent_call(c.tool) for c in calls)


def observe_answers(rt: Runtime, calls: Sequence[Row[Any]], segment: int) -> None:
    """Run the parent agent's ``after_tool`` hooks on the answers of the
    subagent calls of ``segment`` (rows of
    :func:`~orchestrator.store.advance_sql.ready_calls`) whose child ran: a
    call refused before its child started (a policy's stop, a limit) is
    answered without the hooks, as a refused tool call is.

    Called by ``chorus.advance`` once every call of the segment has its
    result and before the cursor moves, outside any transaction: the
    child's end (:func:`~orchestrator.engine.subagents.answer_parent`)
    writes the answer while it holds the child's and the parent's rows,
    and user code must not run there.
    At least once, as for a tool run: a copy of the advance that runs again
    before the cursor moved runs them again."""
    answered = [c for c in calls if c.segment == segment and is_subagent_call(c.tool)]
    if not answered:
        return
    with rt.session() as session:
        ran = [(read_call(session, c.id), c) for c in answered if has_child(session, c.id)]
    for caller, row in ran:
        if caller is None:
            continue
        call, turn, conv, _ = caller
        spec = AgentSpec.model_validate(conv.agent_spec)
        run = tool_call(spec, call, (turn.id, turn.context_data), conv.id)
        after_tool(tool_policies(spec), run, row.result, row.is_error)
