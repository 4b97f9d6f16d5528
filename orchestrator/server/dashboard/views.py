"""What templates show that the API's JSON does not say directly: the tree
nested, the budget against its limits, and readable figures."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2


@dataclass
class Node:
    """A conversation of the tree, with its children."""

    data: dict[str, Any]
    children: list[Node] = field(default_factory=list)


def tree(conversations: list[dict[str, Any]]) -> list[Node]:
    """The conversations nested under their parents (roots first)."""
    nodes = {c["conversation_id"]: Node(c) for c in conversations}
    roots: list[Node] = []
    for node in nodes.values():
        parent = nodes.get(node.data.get("parent_id") or "")
        (parent.children if parent is not None else roots).append(node)
    return roots


@dataclass
class Gauge:
    """One budget limit: how much is spent of it."""

    name: str
    spent: float
    limit: float

    @property
    def percent(self) -> float:
        return min(100.0, round(100.0 * self.spent / self.limit, 1)) if self.limit else 0.0


def budget(run: dict[str, Any]) -> list[Gauge]:
    """The job's budget limits that are set, each with what its tree spent."""
    limits = run.get("budget") or {}
    usage = run["job"]["tree_usage"]
    spent = {
        "cost_usd": usage["cost_usd"],
        "tokens": usage["input_tokens"] + usage["output_tokens"],
        "steps": run["steps"],
        "tool_calls": run["tool_calls"],
    }
    return [Gauge(name, spent[name], limits[name]) for name in spent if limits.get(name)]


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def when(value: str | None) -> str:
    if not value:
        return "-"
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")


def tokens(usage: dict[str, Any]) -> str:
    return f"{usage['input_tokens']:,} in / {usage['output_tokens']:,} out"


def arguments(value: Any) -> str:
    """A call's arguments as indented JSON, characters as they are (the
    template's autoescape makes it safe HTML): what a person approves reads
    ``O'Brien`` and ``Zürich``, not ``O\\u0027Brien`` and ``Z\\u00fcrich``."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def install(env: jinja2.Environment) -> None:
    env.filters.update(seconds=seconds, usd=usd, when=when, tokens=tokens, arguments=arguments)
