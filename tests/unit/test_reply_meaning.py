"""What a stored reply means (:func:`reply_meaning`): every branch, no services."""

from __future__ import annotations

from typing import Any

from orchestrator.engine.budget import NO_MORE_TOOLS
from orchestrator.engine.reply_meaning import (
    Finish,
    GiveUp,
    Handling,
    Nudge,
    PlannedCall,
    RunCalls,
    StepFacts,
    ToolKind,
    answered_in_step,
    final_answer_errors,
    reply_meaning,
    spends_output_attempt,
)
from orchestrator.engine.structured_output import NUDGE
from orchestrator.llm.reply import ModelReply
from schemas import AgentSpec, ToolCallBlock, Usage

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


def _spec(**fields: Any) -> AgentSpec:
    return AgentSpec(name="a", model="m", **fields)


def _reply(*calls: tuple[str, dict[str, Any]], text: str = "") -> ModelReply:
    blocks = [
        ToolCallBlock(tool_request_id=f"r{i}", tool=tool, params=params)
        for i, (tool, params) in enumerate(calls)
    ]
    return ModelReply(text=text, tool_calls=blocks, usage=Usage())


def _facts(
    offered: tuple[str, ...] = (),
    *,
    kinds: dict[str, ToolKind] | None = None,
    tools_allowed: bool = True,
    left: int | None = None,
    cap: int = 64,
    attempts: int = 0,
) -> StepFacts:
    return StepFacts(tools_allowed, frozenset(offered), kinds or {}, left, cap, attempts)


def _meaning(spec: AgentSpec, reply: ModelReply, facts: StepFacts) -> Any:
    return reply_meaning(spec, reply, final_answer_errors(spec, reply), facts)


def _handling(meaning: RunCalls) -> list[tuple[str, int, Handling]]:
    return [(p.call.tool, p.segment, p.handling) for p in meaning.calls]


def test_text_without_calls_finishes_the_turn_with_it() -> None:
    assert _meaning(_spec(), _reply(text="Paris."), _facts()) == Finish("Paris.")


def test_a_valid_final_answer_finishes_with_its_object_and_json() -> None:
    spec = _spec(output_schema=SCHEMA)
    reply = _reply(("final_answer", {"city": "Paris"}), ("search", {}))
    meaning = _meaning(spec, reply, _facts(("final_answer", "search")))
    assert meaning == Finish('{"city": "Paris"}', {"city": "Paris"})
    assert not spends_output_attempt(spec, reply, [], True)


def test_text_where_a_final_answer_is_required_is_nudged_until_the_retries_are_spent() -> None:
    spec = _spec(output_schema=SCHEMA, output_retries=2)
    reply = _reply(text="It is Paris.")
    assert spends_output_attempt(spec, reply, None, True)
    assert _meaning(spec, reply, _facts(attempts=1)) == Nudge()
    assert _meaning(spec, reply, _facts(attempts=2)) == GiveUp(
        "no valid structured output after 3 attempts: no final_answer call"
    )
    assert "final_answer" in NUDGE


def test_a_rejected_final_answer_is_refused_in_its_batch_then_gives_up() -> None:
    spec = _spec(output_schema=SCHEMA, output_retries=1)
    reply = _reply(("final_answer", {"town": "Paris"}))
    errors = final_answer_errors(spec, reply)
    assert errors and spends_output_attempt(spec, reply, errors, True)
    meaning = _meaning(spec, reply, _facts(("final_answer",)))
    assert isinstance(meaning, RunCalls)
    [planned] = meaning.calls
    assert planned.handling is Handling.REFUSE
    assert planned.error is not None
    assert planned.error.startswith("Error: the final answer does not match the schema: ")
    given_up = _meaning(spec, reply, _facts(("final_answer",), attempts=1))
    assert isinstance(given_up, GiveUp)
    assert given_up.error.startswith("no valid structured output after 2 attempts: Error: ")


def test_once_the_tool_budget_is_spent_whatever_the_model_says_is_its_answer() -> None:
    reply = _reply(("search", {}), text="Best guess: Paris.")
    facts = _facts(("search",), tools_allowed=False)
    assert _meaning(_spec(tools=("search",)), reply, facts) == Finish("Best guess: Paris.")
    # a rejected final answer still counts as an attempt then
    spec = _spec(output_schema=SCHEMA, output_retries=0)
    rejected = _reply(("final_answer", {}), text="Paris")
    assert isinstance(_meaning(spec, rejected, facts), GiveUp)
    assert _meaning(_spec(output_schema=SCHEMA), rejected, facts) == Finish("Paris")


def test_parallel_calls_share_a_segment_and_a_barrier_is_its_own() -> None:
    spec = _spec(tools=("a", "b", "slow", "c"))
    kinds = {"a": (True, "tools"), "b": (True, "io"), "slow": (False, "cpu"), "c": (True, "tools")}
    reply = _reply(("a", {}), ("b", {}), ("slow", {}), ("c", {}), ("a", {}))
    meaning = _meaning(spec, reply, _facts(spec.tools, kinds=kinds))
    assert isinstance(meaning, RunCalls)
    assert [(p.segment, p.parallelizable, p.queue) for p in meaning.calls] == [
        (0, True, "tools"),
        (0, True, "io"),
        (1, False, "cpu"),
        (2, True, "tools"),
        (2, True, "tools"),
    ]
    assert {p.handling for p in meaning.calls} == {Handling.RUN}
    assert meaning.counted == 5


def test_max_parallel_tools_cuts_a_run_of_parallel_calls() -> None:
    spec = _spec(tools=("a",), max_parallel_tools=2)
    meaning = _meaning(spec, _reply(*[("a", {})] * 5), _facts(("a",)))
    assert isinstance(meaning, RunCalls)
    assert [p.segment for p in meaning.calls] == [0, 0, 1, 1, 2]


def test_a_call_not_offered_is_refused_and_segmented_as_unknown() -> None:
    spec = _spec(tools=("a", "mcp_only"))
    kinds = {"a": (False, "cpu"), "other": (False, "cpu")}
    reply = _reply(("other", {}), ("mcp_only", {}), ("a", {}))
    meaning = _meaning(spec, reply, _facts(("a", "mcp_only"), kinds=kinds))
    assert isinstance(meaning, RunCalls)
    other, unlisted, a = meaning.calls
    assert other == PlannedCall(
        other.call,
        0,
        True,
        "tools",
        Handling.REFUSE,
        "Error: tool 'other' is not available to agent 'a'",
    )
    # offered, but nothing registered of it (a server's tool): parallel, on "tools"
    assert (unlisted.segment, unlisted.queue, unlisted.handling) == (0, "tools", Handling.RUN)
    assert (a.segment, a.parallelizable, a.handling) == (1, False, Handling.RUN)


def test_calls_past_the_budget_and_past_the_reply_cap_are_refused_and_not_counted() -> None:
    spec = _spec(tools=("a",))
    reply = _reply(*[("a", {})] * 4)
    meaning = _meaning(spec, reply, _facts(("a",), left=2, cap=3))
    assert isinstance(meaning, RunCalls)
    assert [p.handling for p in meaning.calls] == [Handling.RUN] * 2 + [Handling.REFUSE] * 2
    assert meaning.calls[2].error == f"Error: not run: {NO_MORE_TOOLS}"
    assert meaning.calls[3].error == "Error: not run: one reply may make at most 3 tool calls"
    assert meaning.counted == 2
    uncapped = _meaning(spec, reply, _facts(("a",), cap=3))
    assert isinstance(uncapped, RunCalls) and uncapped.counted == 3


def test_plan_and_handoff_calls_are_answered_in_the_step() -> None:
    spec = _spec(tools=("a",), planning=True, handoffs=("billing",))
    reply = _reply(("manage_todo_list", {"todos": []}), ("handoff__billing", {}), ("a", {}))
    offered = ("a", "manage_todo_list", "handoff__billing")
    meaning = _meaning(spec, reply, _facts(offered))
    assert isinstance(meaning, RunCalls)
    assert _handling(meaning) == [
        ("manage_todo_list", 0, Handling.UPDATE_PLAN),
        ("handoff__billing", 0, Handling.HAND_OFF),
        ("a", 0, Handling.RUN),
    ]
    assert answered_in_step(spec, "manage_todo_list")
    assert not answered_in_step(_spec(), "manage_todo_list")
    assert answered_in_step(_spec(), "handoff__x")


def test_a_handoff_the_agent_may_not_make_is_refused() -> None:
    spec = _spec(handoffs=("billing",))
    meaning = _meaning(spec, _reply(("handoff__sales", {})), _facts(("handoff__billing",)))
    assert isinstance(meaning, RunCalls)
    assert _handling(meaning) == [("handoff__sales", 0, Handling.REFUSE)]
