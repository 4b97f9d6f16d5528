"""What a model's reply means for its turn, decided as a value.

:func:`reply_meaning` is a pure function: no database, no Redis, no
clock, no registry. It reads the reply, the agent's spec and what the
step read before it (the tools it offered, what the registry says of the
called tools, the job's tool calls left, the output attempts spent) and
returns one of

- :class:`Finish`: the turn ends with the reply's text, or with a valid
  ``final_answer`` (its object and JSON);
- :class:`Nudge`: a text answer where a final answer is required: ask again;
- :class:`GiveUp`: no valid final answer after ``output_retries`` more
  attempts: the turn fails;
- :class:`RunCalls`: a batch of tool calls, each with its segment and
  how it is handled (:class:`Handling`): run by a tool task, refused with
  an error result, or answered in the step (a plan update, a handoff).

A handoff is one of a batch's calls: the step answers it
(:func:`~orchestrator.engine.handoffs.answer_handoff`) and the batch's
other calls still run; the switch to the target agent is made by the
advance that ends the step. :mod:`orchestrator.engine.persist` applies
the value: it stores what it says, in one transaction with the cursor's move.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from orchestrator.engine.access import refusal
from orchestrator.engine.budget import NO_MORE_TOOLS
from orchestrator.engine.handoffs import is_handoff_call
from orchestrator.engine.planning import PLAN_TOOL
from orchestrator.engine.structured_output import (
    FINAL_ANSWER,
    as_output,
    final_call,
    problems,
    rejection,
)
from orchestrator.llm.reply import ModelReply
from schemas import AgentSpec, ToolCallBlock

#: How a call that is run or answered in the step is segmented: whether it
#: may run beside its neighbours, and its queue (a registered tool's, or a
#: subagent template's).
ToolKind = tuple[bool, str]

#: A call nothing is known of (refused, a built-in, a tool this worker
#: lacks) shares a segment with its parallel neighbours on the tools queue.
_UNKNOWN: ToolKind = (True, "tools")


class Handling(Enum):
    """What the step does with one call of a batch."""

    RUN = "run"  #: a tool task runs it (segment 0 at once, the others later)
    REFUSE = "refuse"  #: stored with :attr:`PlannedCall.error` as its result, not run
    UPDATE_PLAN = "update-plan"  #: answered in the step: the agent's plan
    HAND_OFF = "hand-off"  #: answered in the step: a handoff to another agent


@dataclass(frozen=True)
class PlannedCall:
    """One call of a batch: its segment, where it runs and how it is handled."""

    call: ToolCallBlock
    segment: int
    parallelizable: bool
    queue: str
    handling: Handling
    error: str | None = None  #: the result of a refused call


@dataclass(frozen=True)
class Finish:
    """The reply ends the turn: ``output`` is its text (a valid final
    answer's JSON), ``structured`` the final answer's object, if any."""

    output: str
    structured: dict[str, Any] | None = None


@dataclass(frozen=True)
class Nudge:
    """Text where a final answer is required: the model is asked again."""


@dataclass(frozen=True)
class GiveUp:
    """No valid final answer within the attempts allowed: the turn fails with ``error``."""

    error: str


@dataclass(frozen=True)
class RunCalls:
    """A batch of tool calls to store, segment by segment. ``counted``:
    the calls added to the job's tool-call totals (those not refused for
    the budget or the reply's cap)."""

    calls: tuple[PlannedCall, ...]
    counted: int


ReplyMeaning = Finish | Nudge | GiveUp | RunCalls


@dataclass(frozen=True)
class StepFacts:
    """What the step read that the meaning of its reply depends on.

    Attributes:
        tools_allowed: The job's tool-call budget was not spent when the
            step began (once it is, whatever the model says is its answer).
        offered: The qualified names of the tools the step offered; a call
            to any other name is refused.
        kinds: What the registry says of the called tools that were
            offered (:data:`ToolKind`); a name missing here is :data:`_UNKNOWN`.
        tool_calls_left: The job's tool calls left (None: no budget).
        max_reply_tool_calls: The most calls one reply may make.
        output_attempts: Rejected final answers and nudges so far in the
            turn; read only when :func:`spends_output_attempt` says the
            reply is one (otherwise it does not matter).
    """

    tools_allowed: bool
    offered: Collection[str]
    kinds: Mapping[str, ToolKind]
    tool_calls_left: int | None
    max_reply_tool_calls: int
    output_attempts: int = 0


def final_answer_errors(spec: AgentSpec, reply: ModelReply) -> list[str] | None:
    """What is wrong with the reply's ``final_answer`` call (empty: valid);
    None if the agent has no output schema or the reply makes no such call.
    CPU only, bounded (:func:`~orchestrator.engine.structured_output.problems`)."""
    final = final_call(spec, reply.tool_calls)
    return None if final is None else problems(spec, final.params)


_Verdict = Literal["structured", "answer", "tools", "nudge"]


def _verdict(
    spec: AgentSpec, reply: ModelReply, errors: list[str] | None, tools_allowed: bool
) -> _Verdict:
    """What the reply does before its output attempts are counted."""
    if errors == []:
        return "structured"
    if not tools_allowed:
        return "answer"
    if reply.tool_calls:
        return "tools"
    return "nudge" if spec.output_schema is not None else "answer"


def spends_output_attempt(
    spec: AgentSpec, reply: ModelReply, errors: list[str] | None, tools_allowed: bool
) -> bool:
    """Is the reply an attempt at a final answer that failed (a rejected
    ``final_answer``, or text where one is required)? Then its meaning
    depends on :attr:`StepFacts.output_attempts`."""
    return bool(errors) or _verdict(spec, reply, errors, tools_allowed) == "nudge"


def answered_in_step(spec: AgentSpec, tool: str) -> bool:
    """Is a call of ``tool`` one the step answers itself (a plan update, a handoff)?"""
    return (tool == PLAN_TOOL and spec.planning) or is_handoff_call(tool)


def reply_meaning(
    spec: AgentSpec, reply: ModelReply, errors: list[str] | None, facts: StepFacts
) -> ReplyMeaning:
    """What the reply means for its turn. ``errors``: the reply's
    :func:`final_answer_errors`."""
    verdict = _verdict(spec, reply, errors, facts.tools_allowed)
    if (
        spends_output_attempt(spec, reply, errors, facts.tools_allowed)
        and facts.output_attempts >= spec.output_retries
    ):
        reason = rejection(errors) if errors else "no final_answer call"
        return GiveUp(
            f"no valid structured output after {spec.output_retries + 1} attempts: {reason}"
        )
    if verdict == "structured":
        final = final_call(spec, reply.tool_calls)
        assert final is not None
        return Finish(as_output(final.params), final.params)
    if verdict == "nudge":
        return Nudge()
    if verdict == "answer":
        return Finish(reply.text)
    counted = min(len(reply.tool_calls), facts.max_reply_tool_calls)
    if facts.tool_calls_left is not None:
        counted = min(counted, facts.tool_calls_left)
    return RunCalls(tuple(_plan_calls(spec, reply.tool_calls, errors, facts)), counted)


def _plan_calls(
    spec: AgentSpec, calls: list[ToolCallBlock], errors: list[str] | None, facts: StepFacts
) -> list[PlannedCall]:
    """Each call with its segment and handling. A maximal run of
    parallelizable calls shares a segment, cut every ``max_parallel_tools``
    calls when the agent sets it; each other call is its own. A call the
    agent may not make or the step did not offer, a rejected final answer,
    a call past the job's tool-call budget or past the calls one reply may
    make is refused; a plan or handoff call is answered in the step."""
    out: list[PlannedCall] = []
    segment, prev_parallel, size = -1, False, 0
    cap, left = spec.max_parallel_tools, facts.tool_calls_left
    for position, call in enumerate(calls):
        refused = refusal(spec, call.tool, facts.offered)
        parallel, queue = _UNKNOWN if refused else facts.kinds.get(call.tool, _UNKNOWN)
        if not (parallel and prev_parallel) or (cap is not None and size >= cap):
            segment, size = segment + 1, 0
        prev_parallel, size = parallel, size + 1
        if call.tool == FINAL_ANSWER and errors is not None:
            refused = rejection(errors)
        elif refused is None and left is not None and position >= left:
            refused = f"Error: not run: {NO_MORE_TOOLS}"
        if position >= facts.max_reply_tool_calls:
            refused = (
                f"Error: not run: one reply may make at most {facts.max_reply_tool_calls} "
                "tool calls"
            )
        handling = Handling.RUN
        if refused is not None:
            handling = Handling.REFUSE
        elif is_handoff_call(call.tool):
            handling = Handling.HAND_OFF
        elif answered_in_step(spec, call.tool):
            handling = Handling.UPDATE_PLAN
        out.append(PlannedCall(call, segment, parallel, queue, handling, refused))
    return out
