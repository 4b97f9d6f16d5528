"""Scripted replies, without any model client: what a test model answers.

A *script* is a sequence of items, each a fixed :class:`Reply` or a
function of the request's messages returning one; the item played is the
one whose index is the number of assistant messages already in the
conversation. :mod:`orchestrator.llm.scripted` plays scripts as a litellm
provider (any process, through litellm's real code path);
:mod:`orchestrator.llm.function` plays them, and Python functions, in process
without litellm.

Usage is counted the same way everywhere: a rough word count, prompt words
in and reply words out, unless the reply sets it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeAlias


@dataclass(frozen=True)
class ScriptedToolCall:
    """One tool call the scripted model makes.

    Attributes:
        tool: Tool name; need not be one of the tools offered to the model.
        params: Arguments. A dict is sent as JSON; a string is sent verbatim,
            which lets a test send arguments that are not valid JSON.
        id: Tool call id; a unique ``call_<uuid hex>`` is generated when None.
    """

    tool: str
    params: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments(self) -> str:
        """The arguments as the string the model sends."""
        return self.params if isinstance(self.params, str) else json.dumps(self.params)


@dataclass(frozen=True)
class Reply:
    """One scripted model answer: text, tool calls and optionally its usage.

    Attributes:
        text: Assistant text (may be empty when there are tool calls).
        tool_calls: Tool calls, in order.
        input_tokens: Reported prompt tokens; a word count of the prompt if None.
        output_tokens: Reported completion tokens; a word count of the reply if None.
    """

    text: str = ""
    tool_calls: list[ScriptedToolCall] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None

    @classmethod
    def say(cls, text: str) -> Reply:
        """A reply with text only (the model ends its turn)."""
        return cls(text=text)

    @classmethod
    def call(cls, *calls: ScriptedToolCall, text: str = "") -> Reply:
        """A reply that calls tools, with optional text before the calls."""
        return cls(text=text, tool_calls=list(calls))


def call(tool: str, /, **params: Any) -> ScriptedToolCall:
    """Shorthand for a tool call: ``call("search", query="x")``."""
    return ScriptedToolCall(tool=tool, params=params)


#: A script item: a fixed reply or a function of the received messages.
ScriptItem: TypeAlias = Reply | Callable[[list[dict[str, Any]]], Reply]


class ScriptFailure(Exception):
    """A script cannot answer: exhausted, or a reply function failed."""


def play(
    name: str,
    script: Sequence[ScriptItem],
    messages: list[dict[str, Any]],
    passthrough: tuple[type[BaseException], ...] = (),
) -> Reply:
    """The reply of ``script`` (called ``name`` in errors) for this
    conversation: item number = assistant messages so far.

    Raises:
        ScriptFailure: The script is exhausted, or a reply function raised
            (other than ``passthrough``) or returned something not a Reply.
    """
    index = sum(1 for m in messages if m.get("role") == "assistant")
    if index >= len(script):
        raise ScriptFailure(
            f"script {name!r} is exhausted: it has {len(script)} replies and the "
            f"conversation already holds {index} assistant messages"
        )
    item = script[index]
    if isinstance(item, Reply):
        return item
    try:
        reply = item(messages)
    except passthrough:
        raise
    except Exception as exc:
        raise ScriptFailure(f"reply #{index} of script {name!r} raised {exc!r}") from exc
    if not isinstance(reply, Reply):
        raise ScriptFailure(f"reply #{index} of script {name!r} returned {reply!r}, not a Reply")
    return reply


def words(text: str) -> int:
    """The rough token count of ``text``: its words."""
    return len(text.split())


def _content_words(content: Any) -> int:
    if isinstance(content, str):
        return words(content)
    if isinstance(content, list):
        return sum(words(str(p.get("text", ""))) for p in content if isinstance(p, dict))
    return 0


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The rough token count of a request's messages (text and call arguments)."""
    total = 0
    for message in messages:
        total += _content_words(message.get("content"))
        for tool_call in message.get("tool_calls") or []:
            function = tool_call.get("function") or {}
            total += 1 + words(str(function.get("arguments") or ""))
    return total


def text_pieces(text: str) -> list[str]:
    """Split text into word pieces that keep their trailing whitespace (the deltas)."""
    return [p for p in re.split(r"(?<=\s)(?=\S)", text) if p]


#: The litellm provider name: models are ``scripted/<script name>``.
PROVIDER = "scripted"


_scripts: dict[str, tuple[ScriptItem, ...]] = {}
_lock = threading.Lock()
_tools: ContextVar[tuple[dict[str, Any], ...]] = ContextVar("scripted_tools", default=())


def offered_tools() -> list[dict[str, Any]]:
    """The ``tools=`` of the model call a reply function is answering, as
    the provider received them (empty outside a call, or without tools)."""
    return list(_tools.get())


def register_script(name: str, replies: Sequence[ScriptItem]) -> None:
    """Register (or replace) the script ``name`` in this process.

    Args:
        name: Script name; the model string is ``scripted/<name>``.
        replies: Replies in conversation order. A callable item receives the
            OpenAI-format messages litellm passed to the provider and returns
            the reply, so it can quote tool results.

    Raises:
        ValueError: If the name is empty or has surrounding whitespace.
    """
    if not name or name != name.strip():
        raise ValueError(f"invalid script name {name!r}")
    with _lock:
        _scripts[name] = tuple(replies)


def unregister_script(name: str) -> None:
    """Forget the script ``name`` (no error if it is not registered)."""
    with _lock:
        _scripts.pop(name, None)


def scripted_model(name: str) -> str:
    """The litellm model string of the script ``name``: ``scripted/<name>``."""
    return f"{PROVIDER}/{name}"
