"""Retry backoff, and the policy seam: the chain's order and what it refuses."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.errors import ConfigurationError, ModelError, PolicyError
from orchestrator.policies import (
    Defer,
    Failure,
    ModelCall,
    Policy,
    Stop,
    ToolCall,
    get_policy,
    policy,
    register_policy,
    retry_delay,
)
from orchestrator.policies.chain import (
    after_model,
    after_tool,
    before_model,
    before_tool,
    on_model_failure,
)
from schemas import AgentSpec
from schemas.specs import RetryPolicy


def test_delays_grow_exponentially_up_to_the_cap_then_stop() -> None:
    policy = RetryPolicy(max_attempts=6, initial_delay=1, factor=3, max_delay=20, jitter=0)
    assert [retry_delay(policy, n) for n in range(1, 7)] == [1, 3, 9, 20, 20, None]


def test_jitter_spreads_delays_within_its_fraction() -> None:
    policy = RetryPolicy(initial_delay=10, jitter=0.2)
    rng = random.Random(7)
    delays = [retry_delay(policy, 1, rng) for _ in range(200)]
    assert all(d is not None and 8 <= d <= 12 for d in delays)
    assert len({round(d or 0, 6) for d in delays}) > 100


# --- The seam: the chain's order and what it refuses -------------------------

AGENT = AgentSpec(name="unit", model="openai/primary", retry=RetryPolicy(max_attempts=3))


def model_call(attempt: int = 1, *failures: Failure) -> ModelCall:
    return ModelCall(
        agent=AGENT,
        conversation_id="c",
        turn_id="t",
        step=0,
        context_data={},
        attempt=attempt,
        failures=failures,
        model=AGENT.model,
        messages=[{"role": "user", "content": "hi"}],
    )


class Recorder(Policy):
    def __init__(self, tag: str, seen: list[str], before: Callable[[ModelCall], Any] | None = None):
        self.tag, self.seen, self.before = tag, seen, before

    def before_model(self, call: ModelCall) -> Any:
        self.seen.append(f"before {self.tag} {call.model}")
        return self.before(call) if self.before else call

    def after_model(self, call: ModelCall, reply: Any) -> None:
        self.seen.append(f"after {self.tag}")

    def on_model_failure(self, call: ModelCall, error: ModelError) -> None:
        self.seen.append(f"failure {self.tag}")


def test_before_hooks_run_in_order_and_see_the_rewrites_after_hooks_the_other_way() -> None:
    seen: list[str] = []
    first = Recorder("a", seen, lambda c: c.rewrite(model="openai/other"))
    second = Recorder("b", seen)

    name, call = before_model([first, second], model_call())
    after_model([first, second], call, object())  # type: ignore[arg-type]

    assert name == "" and isinstance(call, ModelCall) and call.model == "openai/other"
    assert seen == ["before a openai/primary", "before b openai/other", "after b", "after a"]


def test_the_first_defer_or_stop_ends_the_chain() -> None:
    seen: list[str] = []
    stopper = Recorder("a", seen, lambda c: Stop("no"))
    stopper.name = "stopper"
    decided = before_model([stopper, Recorder("b", seen)], model_call())
    assert decided == ("stopper", Stop("no"))
    assert seen == ["before a openai/primary"]


def test_failures_go_to_listed_policies_last_first_then_to_the_built_in_retry() -> None:
    seen: list[str] = []
    error = ModelError("overloaded", status=503, retryable=True)
    name, decided = on_model_failure(
        [Recorder("a", seen), Recorder("b", seen)], model_call(), error
    )
    assert seen == ["failure b", "failure a"]
    assert name == "retry" and isinstance(decided, Defer)


def test_the_built_in_retry_stops_past_max_attempts_and_on_errors_not_worth_retrying() -> None:
    retryable = ModelError("overloaded", status=503, retryable=True)
    assert isinstance(on_model_failure([], model_call(2), retryable)[1], Defer)
    name, last = on_model_failure([], model_call(3), retryable)
    assert name == "retry" and isinstance(last, Stop) and "after 3 attempt(s)" in last.reason
    refused = on_model_failure([], model_call(), ModelError("bad key", status=401))[1]
    assert isinstance(refused, Stop) and "after 1 attempt(s)" in refused.reason


class Raises(Policy):
    name = "raises"

    def before_model(self, call: ModelCall) -> ModelCall:
        raise ValueError("a bug")


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda c: None, "returned NoneType"),
        (lambda c: Defer(float("inf")), "deferred by inf"),
        (lambda c: Defer(-1), "deferred by -1"),
        (lambda c: c.rewrite(model=" "), "empty model"),
        (lambda c: c.rewrite(settings={"api_key": "sk-x"}), "api_key"),
        (lambda c: c.rewrite(model="https://u:p@host/x"), "credentials"),
    ],
)
def test_what_a_policy_may_not_return_is_a_policy_error_naming_it(
    returned: Callable[[ModelCall], Any], message: str
) -> None:
    bad = Recorder("x", [], returned)
    bad.name = "bad"
    with pytest.raises(PolicyError, match=message) as caught:
        before_model([bad], model_call())
    assert caught.value.policy == "bad" and "'bad'" in str(caught.value)


def test_a_hook_that_raises_is_a_policy_error_with_the_cause() -> None:
    with pytest.raises(PolicyError, match="raised in before_model: ValueError: a bug") as caught:
        before_model([Raises()], model_call())
    assert isinstance(caught.value.__cause__, ValueError)


def test_the_step_failures_are_what_a_policy_decides_by() -> None:
    failures = (Failure("openai/primary", 503, True), Failure("openai/primary", 429, True))
    call = model_call(3, *failures)
    assert call.last_failure == failures[1]
    assert [f.server_error for f in call.failures] == [True, False]
    assert Failure.from_json(failures[0].to_json()) == failures[0]


def test_policies_register_by_name_as_functions_or_classes() -> None:
    @policy("unit-function")
    def admit(call: ModelCall) -> ModelCall:
        return call

    @policy("unit-class")
    class Admit(Policy):
        pass

    assert get_policy("unit-function") is admit and admit.name == "unit-function"
    assert isinstance(get_policy("unit-class"), Admit)
    with pytest.raises(ConfigurationError, match="two different policies"):
        register_policy("unit-class", Raises())
    with pytest.raises(ConfigurationError, match="policy name"):
        register_policy("not a name", Raises())


def test_tool_hooks_rewrite_in_order_and_the_first_stop_refuses() -> None:
    seen: list[str] = []

    class Tagger(Policy):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def before_tool(self, call: ToolCall) -> ToolCall | Stop:
            seen.append(f"before {self.tag} {call.params}")
            return call.rewrite(params={**call.params, self.tag: True})

        def after_tool(self, call: ToolCall, result: Any, is_error: bool) -> None:
            seen.append(f"after {self.tag}")

    tool = ToolCall(AGENT, "c", "t", 0, {}, "add", {"a": 1}, "call-1", 1)
    name, run = before_tool([Tagger("x"), Tagger("y")], tool)
    assert name == "" and isinstance(run, ToolCall)
    after_tool([Tagger("x"), Tagger("y")], run, 3, False)
    assert run.params == {"a": 1, "x": True, "y": True} and tool.params == {"a": 1}
    assert seen == ["before x {'a': 1}", "before y {'a': 1, 'x': True}", "after y", "after x"]

    refuser = Recorder("r", [])
    refuser.name = "refuser"
    refuser.before_tool = lambda call: Stop("no")  # type: ignore[method-assign]
    assert before_tool([refuser, Tagger("z")], tool) == ("refuser", Stop("no"))
    refuser.before_tool = lambda call: None  # type: ignore[method-assign]
    with pytest.raises(PolicyError, match="before_tool returned NoneType"):
        before_tool([refuser], tool)
