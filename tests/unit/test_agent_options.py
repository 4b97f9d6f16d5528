"""``Agent(...)`` takes every option of an agent spec, with the spec's defaults."""

from __future__ import annotations

import inspect

from orchestrator import Agent
from orchestrator.agents import RENAMED_FIELDS
from orchestrator.policies import retry_delay
from schemas import AgentSpec, RetryPolicy


def _parameters() -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(Agent).parameters)


def test_every_agent_spec_field_is_an_agent_argument() -> None:
    params = _parameters()
    for field in AgentSpec.model_fields:
        assert RENAMED_FIELDS.get(field, field) in params, f"Agent lacks {field}"
    assert set(params) == {RENAMED_FIELDS.get(f, f) for f in AgentSpec.model_fields}


def test_options_are_typed_keyword_only_and_default_as_the_spec() -> None:
    positional = ("name", "model", "system", "tools")
    for name, param in _parameters().items():
        assert param.annotation is not inspect.Parameter.empty, name
        if name not in positional:
            assert param.kind is inspect.Parameter.KEYWORD_ONLY, name
        field = AgentSpec.model_fields.get(name)
        if field is not None and param.default is not inspect.Parameter.empty:
            default = field.get_default(call_default_factory=True)
            assert param.default == default or (param.default in ((), None) and not default), name


def test_the_readme_options_reach_the_spec() -> None:
    retry = RetryPolicy(max_attempts=5, initial_delay=1, factor=2, max_delay=60, jitter=0.2)
    spec = Agent(
        "options-probe",
        model="scripted/none",
        retry=retry,
        context=["checkpoint"],
        context_tokens=100_000,
        checkpoint_strategy="briefing",
        output_retries=4,
    )
    assert spec.retry == retry
    assert spec.context == ("checkpoint",)
    assert (spec.context_tokens, spec.checkpoint_strategy, spec.output_retries) == (
        100_000,
        "briefing",
        4,
    )


def test_defaults_are_the_documented_ones() -> None:
    # README "Defaults": max_steps 100; retries ride out about five minutes
    spec = AgentSpec(name="defaults", model="scripted/none")
    assert spec.max_steps == 100
    delays = [retry_delay(spec.retry.model_copy(update={"jitter": 0.0}), n) for n in range(1, 11)]
    assert delays[-1] is None  # the tenth failure is the last attempt
    window = sum(d for d in delays if d is not None)
    assert spec.retry.max_attempts == 10
    assert 270 <= window <= 330, window  # about five minutes of provider trouble
    assert max(d for d in delays if d is not None) == spec.retry.max_delay == 60
