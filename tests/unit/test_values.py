"""What can be stored: caller input is refused by field, model and tool
output is made storable."""

from __future__ import annotations

import math

import pytest

from orchestrator.errors import InvalidRequestError
from orchestrator.llm.call import INVALID_ARGUMENTS_KEY, parse_arguments
from orchestrator.store.values import MAX_DEPTH, TOO_DEEP, check, storable


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "path", "why"),
    [
        ({"a": ["x", "b\x00"]}, "context_data.a.1", "NUL"),
        ({"a": "\ud83d"}, "context_data.a", "lone surrogate"),
        ({"k\x00": 1}, "context_data.'k\\x00'", "key contains a NUL"),
        ({"n": math.inf}, "context_data.n", "not a JSON number"),
        ({"n": 2**2000}, "context_data.n", "integer larger"),
        ({"s": {1}}, "context_data.s", "set is not JSON"),
        ({"d": nested(MAX_DEPTH + 1)}, "context_data.d", "nested deeper"),
    ],
)
def test_check_names_the_field_and_the_path(value: object, path: str, why: str) -> None:
    with pytest.raises(InvalidRequestError, match=why) as caught:
        check(value, "context_data")
    assert caught.value.fields == ["context_data"]
    assert str(caught.value).startswith(path)


def test_ordinary_json_passes() -> None:
    check({"a": [1, 2.5, True, None, "é 😀"], "b": nested(MAX_DEPTH - 1)}, "context_data")


def test_storable_replaces_what_postgres_cannot_hold() -> None:
    value = {"t\x00": ["a\x00b", "\udc80", math.nan, -math.inf, 2**2000], "d": nested(100)}
    out = storable(value)
    assert out["t\ufffd"][:4] == ["a\ufffdb", "\ufffd", "NaN", "-Infinity"]
    assert out["t\ufffd"][4] == "[an integer of 2001 bits]"
    check(out, "result")  # storable indeed
    inner = out["d"]
    for _ in range(MAX_DEPTH):
        inner = inner[0]
    assert inner == TOO_DEEP


@pytest.mark.parametrize(
    "arguments",
    ["[" * 5000 + "]" * 5000, '{"a": ' * 100 + "1" + "}" * 100, "[1]", "nope", '"x"'],
)
def test_unusable_arguments_become_invalid(arguments: str) -> None:
    assert list(parse_arguments(arguments)) == [INVALID_ARGUMENTS_KEY]


def test_arguments_are_made_storable() -> None:
    assert parse_arguments('{"a": "x\\u0000", "b": NaN}') == {"a": "x\ufffd", "b": "NaN"}
