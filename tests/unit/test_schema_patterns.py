"""Schema patterns are matched by an engine that releases the GIL and stops
after a bound (orchestrator.patterns), wherever jsonschema applies one."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from orchestrator import ConfigurationError, InvalidRequestError
from orchestrator.tools.json_schema import check_arguments, parameters_validator

POISON = "a" * 40 + "!"
SLOW = "^(a|a)+$"  # backtracks on the regex engine too: only the bound ends it


def _string(**keywords: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": {"type": "string", **keywords}}}


HOSTILE: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (_string(pattern="^(a+)+$"), {"v": POISON}),
    (_string(pattern=SLOW), {"v": POISON}),
    (_string(**{"not": {"pattern": SLOW}}), {"v": POISON}),
    (
        {"type": "object", "properties": {"v": {"type": "array", "items": _string(pattern=SLOW)}}},
        {"v": [{"v": POISON}] * 200},
    ),
    ({"type": "object", "patternProperties": {SLOW: {}}}, {POISON: 1}),
    (
        {"type": "object", "patternProperties": {SLOW: {}}, "additionalProperties": False},
        {POISON: 1},
    ),
    (
        {"type": "object", "patternProperties": {SLOW: {}}, "unevaluatedProperties": False},
        {POISON: 1},
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("schema", "arguments"), HOSTILE)
def test_a_backtracking_pattern_is_refused_without_freezing_the_process(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    validator = parameters_validator("sec.patterns", schema)
    ticks: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        with pytest.raises(InvalidRequestError, match=r"'sec\.patterns'") as caught:
            check_arguments(validator, arguments, "sec.patterns")
    finally:
        done.set()
        ticker.join()
    assert "does not match" in str(caught.value) or "took longer" in str(caught.value)
    if "took longer" in str(caught.value):
        # the other thread ran while the pattern did
        assert len(ticks) >= 3


def test_ordinary_patterns_still_match() -> None:
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
            "password": {"type": "string", "pattern": "^(?=.*[0-9]).{4,}$"},
            "rule": {"type": "string", "format": "regex"},
        },
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": False,
    }
    validator = parameters_validator("sec.ordinary", schema)
    check_arguments(validator, {"code": "PT", "password": "abc1", "rule": "^a+$", "x-n": 1}, "t")
    for wrong, path in [
        ({"code": "pt"}, "$.code"),
        ({"password": "abcd"}, "$.password"),
        ({"rule": "(unclosed"}, "$.rule"),
        ({"x-n": "one"}, "$['x-n']"),
        ({"other": 1}, "$"),
    ]:
        with pytest.raises(InvalidRequestError) as caught:
            check_arguments(validator, wrong, "t")
        assert caught.value.fields == [path]


#: Patterns Python's re takes, that the regex engine would compile for
#: minutes holding the GIL (counted repeats are copies), or cannot nest.
BOMBS = ["(?:(?:(?:(?:a{100}){100}){100}){100})", "(" * 3000 + "a" + ")" * 3000]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bomb", BOMBS)
def test_a_pattern_that_would_compile_for_minutes_is_refused(bomb: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid JSON schema"):
        parameters_validator("sec.bomb", _string(pattern=bomb))
    with pytest.raises(ConfigurationError, match="invalid JSON schema"):
        parameters_validator("sec.bomb", {"type": "object", "patternProperties": {bomb: {}}})
    # and as a value the model sends for a regex
    validator = parameters_validator("sec.bomb", _string(format="regex"))
    with pytest.raises(InvalidRequestError, match="is not a 'regex'"):
        check_arguments(validator, {"v": bomb}, "sec.bomb")
