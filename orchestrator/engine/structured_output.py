"""Structured output: the ``final_answer`` tool and its validation.

An agent with an output schema is offered a ``final_answer`` tool taking
that schema. A valid call ends the turn with the object as its structured
result (and its JSON as the text output). An invalid one, or a text answer
without it, is answered with the validation errors and the model tries
again, at most ``output_retries`` times.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from functools import cache
from typing import Any

from orchestrator.errors import PatternTimeoutError
from schemas import AgentSpec, ToolCallBlock, ToolSpec
from schemas.specs import FINAL_ANSWER

#: CPU seconds one validation of an answer may take. A schema a job supplies
#: can make it exponential without a pattern: nine ``$defs`` each applying
#: the next ten times (``allOf``) took 10**9 keyword checks for one string.
VALIDATION_SECONDS = 1.0


_deadline: ContextVar[float] = ContextVar("chorus_validation_deadline", default=float("inf"))


class ValidationTimeoutError(Exception):
    """Validating an answer took longer than :data:`VALIDATION_SECONDS`."""


def _timed(check: Callable[..., Any]) -> Callable[..., Iterator[Any]]:
    def timed(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if time.thread_time() > _deadline.get():
            raise ValidationTimeoutError
        return check(validator, value, instance, schema) or iter(())

    return timed


@cache
def _validator_class() -> Any:
    """Draft 2020-12 whose every keyword first checks the validation's deadline
    (jsonschema is imported here, by the workers that validate answers: a
    client that only reads ``FINAL_ANSWER`` does not load it)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    return jsonschema.validators.extend(
        base, {name: _timed(check) for name, check in base.VALIDATORS.items()}
    )


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
    Its patterns are matched within :data:`~orchestrator.patterns.PATTERN_SECONDS`,
    the whole validation within :data:`VALIDATION_SECONDS` of CPU."""
    from orchestrator.patterns import limited

    assert spec.output_schema is not None
    validator = _validator_class()(spec.output_schema)
    token = _deadline.set(time.thread_time() + VALIDATION_SECONDS)
    try:
        with limited():
            errors = list(validator.iter_errors(params))
    except PatternTimeoutError as exc:
        return [f"(answer): {exc}"]
    except ValidationTimeoutError:
        return [f"(answer): validating it took longer than {VALIDATION_SECONDS} s; refused"]
    finally:
        _deadline.reset(token)
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
