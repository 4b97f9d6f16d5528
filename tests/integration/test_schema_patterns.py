"""A regular expression a job supplies (an output schema's ``pattern``)
cannot freeze a worker: it is matched by an engine that releases the GIL
and stops after a bound, so the answer gets an error result and the
process's other steps keep streaming meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Client, InvalidRequestError
from schemas import AgentSpec, EventName, ToolResultBlock
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration

MODEL = "openai/loopback-model"
POISON = "a" * 40 + "!"
WORDS = " ".join(f"w{i}" for i in range(40))


def _schema(pattern: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"v": {"type": "string", "pattern": pattern}},
        "required": ["v"],
    }


@pytest.mark.parametrize("pattern", ["^(a+)+$", "^(a|a)+$"])
def test_a_catastrophic_pattern_gets_an_error_result_while_other_steps_stream(
    client: Client, workers: Any, pattern: str
) -> None:
    with LoopbackLLM() as talker, LoopbackLLM() as answerer:
        # Given a job streaming its answer on the llm worker for about 6 s
        talker.enqueue_text(WORDS, chunk_delay=0.15)
        talking = AgentSpec(
            name="sec-talker", model=MODEL, model_settings={"api_base": talker.base_url}
        )
        streaming = client.submit(talking, "talk")
        events = streaming.events(timeout=60)
        next(e for e in events if e.name is EventName.ASSISTANT_DELTA)

        # When a job's model answers a string its output schema's pattern backtracks on
        answerer.enqueue_tool_calls([("final_answer", {"v": POISON})])
        answerer.enqueue_tool_calls([("final_answer", {"v": "aaaa"})])
        spec = AgentSpec(
            name="sec-pattern",
            model=MODEL,
            output_schema=_schema(pattern),
            model_settings={"api_base": answerer.base_url},
        )
        poisoned = client.submit(spec, "answer")

        # Then the answer gets an error result, and the model's next one ends the turn
        assert poisoned.result(timeout=60) == '{"v": "aaaa"}'
        refused = next(
            b
            for m in client.history(poisoned.conversation_id)
            for b in m.content
            if isinstance(b, ToolResultBlock) and b.tool == "final_answer"
        )
        assert refused.is_error
        assert "does not match" in str(refused.result) or "took longer" in str(refused.result)
        rejected = next(e.time for e in poisoned.events() if e.name is EventName.TOOL_FAILED)

        # And the other job streamed on meanwhile, to its end
        deltas = [e for e in events if e.name is EventName.ASSISTANT_DELTA]
        assert streaming.result(timeout=60) == WORDS
        assert deltas and deltas[-1].time > rejected


def test_an_output_schema_that_is_not_a_schema_is_refused_at_submit(client: Client) -> None:
    for schema, message in [
        (_schema("(unclosed"), "not a valid JSON schema"),
        ({"type": "object", "properties": {"v": {"minLength": -1}}}, "not a valid JSON schema"),
        (_schema("(?:(?:(?:(?:a{100}){100}){100}){100})"), "not a valid JSON schema"),
        # a reference that cannot resolve failed the step at the first
        # answer, after its model call was paid
        ({"type": "object", "properties": {"v": {"$ref": "#/nope"}}}, "does not resolve"),
        ({"type": "object", "properties": {"v": {"$ref": "http://127.0.0.1:1/s"}}}, "resolve"),
    ]:
        spec = AgentSpec(name="sec-bad-schema", model="scripted/quick", output_schema=schema)
        with pytest.raises(InvalidRequestError, match=message) as caught:
            client.submit(spec, "hi")
        assert caught.value.fields == ["output_schema"]


def test_an_output_schema_whose_references_multiply_gets_an_error_result(
    client: Client, workers: Any
) -> None:
    # Given a schema of nine levels, each applying the next ten times: a value
    # under it took 10**9 keyword checks, a step thread and a core for hours
    depth = 9
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 10} for i in range(depth)
    }
    defs[f"d{depth}"] = {"type": "string"}
    schema = {"$defs": defs, "type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}}
    with LoopbackLLM() as answerer:
        answerer.enqueue_tool_calls([("final_answer", {"a": "x"})])
        answerer.enqueue_tool_calls([("final_answer", {"b": 1})])
        spec = AgentSpec(
            name="sec-multiplied",
            model=MODEL,
            output_schema=schema,
            model_settings={"api_base": answerer.base_url},
        )
        job = client.submit(spec, "answer")
        # Then the first answer gets an error result at once, the next one ends the turn
        assert job.result(timeout=60) == '{"b": 1}'
        refused = next(
            b
            for m in client.history(job.conversation_id)
            for b in m.content
            if isinstance(b, ToolResultBlock) and b.tool == "final_answer"
        )
        assert refused.is_error
        assert "took longer" in str(refused.result)
