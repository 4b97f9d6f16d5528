"""Structured output: the ``final_answer`` tool and its validation.

An agent with an output schema is offered a ``final_answer`` tool taking
that schema. A valid call ends the turn with the object as its structured
result (and its JSON as the text output). An invalid one, or a text answer
without it, is answered with the validation errors and the model tries
again, at most ``output_retries`` times.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from orchestrator.errors import PatternTimeoutError
from orchestrator.patterns import limited
from schemas import AgentSpec, ToolCallBlock, ToolSpec

FINAL_ANSWER = "final_answer"


def final_answer_tool(spec: AgentSpec) -> ToolSpec | None:
    if spec.output_schema is None:
        return None
    return ToolSpec(
        name=FINAL_ANSWER,
        description="Give your final answer. Call this once, when you are done; "
        "its arguments must match the schema.",
        parameters=spec.output_schema,
        parallelizable=False,
    )


def final_call(spec: AgentSpec, calls: list[ToolCallBlock]) -> ToolCallBlock | None:
    if spec.output_schema is None:
        return None
    return next((c for c in calls if c.tool == FINAL_ANSWER), None)


def problems(spec: AgentSpec, params: dict[str, Any]) -> list[str]:
    """What is wrong with ``params`` for the output schema (empty: valid).
    Its patterns are matched within :data:`~orchestrator.patterns.PATTERN_SECONDS`."""
    assert spec.output_schema is not None
    validator = jsonschema.Draft202012Validator(spec.output_schema)
    try:
        with limited():
            errors = list(validator.iter_errors(params))
    except PatternTimeoutError as exc:
        return [f"(answer): {exc}"]
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(answer)'}: {error.message}"
        for error in sorted(errors, key=lambda e: list(e.path))
    ]


def rejection(errors: list[str]) -> str:
    return "Error: the final answer does not match the schema: " + "; ".join(errors)


NUDGE = (
    "Give your final answer by calling the final_answer tool with arguments matching its schema."
)


def as_output(params: dict[str, Any]) -> str:
    return json.dumps(params, ensure_ascii=False)
