"""Provider-legal aliases of qualified tool names, and declaring schema tools."""

from __future__ import annotations

import pytest

from orchestrator import Agent, ConfigurationError, registry, schema_tool, tool
from orchestrator.tools.names import ALIAS_PATTERN, alias, aliases, hashed

OBJECT = {"type": "object", "properties": {"n": {"type": "integer"}}}


def test_a_legal_name_is_itself_and_others_are_made_legal() -> None:
    assert alias("final_answer") == "final_answer"
    assert alias("weather.forecast") == "weather__forecast"
    assert alias("my tool/v1") == "my_tool_v1"
    long = alias("catalog." + "x" * 80)
    assert ALIAS_PATTERN.match(long) and long == hashed("catalog." + "x" * 80)
    assert alias("catalog." + "x" * 80) != alias("catalog." + "x" * 79 + "y")


def test_colliding_names_offered_together_get_distinct_aliases() -> None:
    names = aliases(["a.b", "a__b", "c.d"])
    assert names["a__b"] == "a__b" and names["c.d"] == "c__d"
    assert names["a.b"] != "a__b" and ALIAS_PATTERN.match(names["a.b"])


def test_an_agent_whose_tools_share_an_alias_is_refused() -> None:
    dotted = schema_tool("b", "", OBJECT, lambda n=0: n, namespace="clash-a")

    @tool(name="clash-a__b")
    def underscored(n: int) -> int:
        return n

    with pytest.raises(ConfigurationError, match="clash-a__b"):
        Agent("clashing", "scripted/none", tools=[dotted, underscored])


def test_a_tool_named_like_a_built_in_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # registered for this test only: an agent declared later in this process
    # (tests.agents' `big-reader`) asks for the built-in by that name
    monkeypatch.setattr(registry, "_tools", dict(registry._tools))
    # a second `read_tool_output` in the request would make providers refuse it
    shadow = schema_tool("read_tool_output", "", OBJECT, lambda n=0: n)
    with pytest.raises(ConfigurationError, match=r"'read_tool_output'.*offered twice"):
        Agent("shadowing", "scripted/none", tools=[shadow])


def test_invalid_declarations_name_the_tool() -> None:
    with pytest.raises(ConfigurationError, match=r"'bad\.obj'.*type 'object'"):
        schema_tool("obj", "", {"type": "string"}, print, namespace="bad")
    with pytest.raises(ConfigurationError, match=r"'bad x\.y'"):
        schema_tool("y", "", OBJECT, print, namespace="bad x")
    with pytest.raises(ConfigurationError, match="two different tools"):
        schema_tool("same", "", OBJECT, print, namespace="twice")
        schema_tool("same", "other", OBJECT, print, namespace="twice")


def test_arguments_are_checked_and_passed_as_sent() -> None:
    from orchestrator.errors import InvalidRequestError

    t = schema_tool("echo", "", OBJECT, lambda args: args, namespace="u", arguments="dict")
    assert t.arguments({}) == {"args": {}}
    with pytest.raises(InvalidRequestError, match=r"\$\.n: 'x' is not of type 'integer'") as e:
        t.arguments({"n": "x"})
    assert e.value.fields == ["$.n"]
