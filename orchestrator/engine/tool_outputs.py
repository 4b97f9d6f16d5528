"""Large tool outputs: archived whole, shown as a view, read back in slices.

A tool result is measured as the text the model would read: a string as
is, any other JSON value serialised (:func:`output_text`). Over the agent's
``tool_output_limit`` (characters), the call's row keeps the result whole
(``chorus_tool_call.result``, marked by ``view_chars``) and the model sees
a *view* instead (:func:`view`): a notice naming the output's handle (the
call's id) and size, its first and last characters, and what was left out.

The built-in tool ``read_tool_output(handle, offset, length)`` returns a
slice of that text: characters ``[offset, offset + length)``, ``length``
at most the limit, after a one-line header saying which part it is. It is
offered to an agent with tools only in a step whose prompt holds a view
(:func:`holds_view`), or on every step when the agent lists it in its
``tools`` (a tool list that does not change keeps the provider's prompt
cache). It runs where other tools run, and reads only outputs archived in
its own conversation tree: any other handle is an error result. Its own
results are never archived.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sqlmodel import Session

from orchestrator.store.tool_call_sql import archived_result
from schemas import AgentSpec, Message, ToolResultBlock, ToolSpec
from schemas.specs import READ_TOOL_OUTPUT

__all__ = ["READ_TOOL_OUTPUT"]
#: Share of a view's characters taken from the output's start (the rest: its end).
HEAD_SHARE = 0.75


def output_text(result: Any) -> str:
    """The text a result is measured and sliced as."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def archives(tool: str, result: Any, limit: int) -> bool:
    """True when the call's result is over ``limit`` and is kept whole
    while the model sees its view (never for ``read_tool_output``)."""
    return tool != READ_TOOL_OUTPUT and len(output_text(result)) > limit


def view(handle: str, tool: str, result: Any, limit: int) -> str:
    """What the model sees of an archived result: a notice, the first and
    the last characters (``limit`` in all) and the gap between them."""
    text = output_text(result)
    head = int(limit * HEAD_SHARE)
    tail = limit - head
    left_out = len(text) - head - tail
    return (
        f"[The output of {tool} is {len(text)} characters: showing the first {head} and "
        f"the last {tail}. Read any part with {READ_TOOL_OUTPUT}"
        f'(handle="{handle}", offset, length).]\n'
        f"{text[:head]}\n[… {left_out} characters left out …]\n{text[len(text) - tail :]}"
    )


#: The first line of a view (:func:`view`).
_NOTICE = re.compile(
    r"\[The output of .+ is \d+ characters: showing the first \d+ and the last \d+\. "
    rf'Read any part with {READ_TOOL_OUTPUT}\(handle="[^"\n]+", offset, length\)\.\]\n'
)


def holds_view(message: Message) -> bool:
    """Does ``message`` hold a tool result shown as a view (a cut output)?"""
    return any(
        isinstance(block, ToolResultBlock)
        and isinstance(block.result, str)
        and _NOTICE.match(block.result) is not None
        for block in message.content
    )


def reads_outputs(spec: AgentSpec) -> bool:
    """Whether the agent may be offered ``read_tool_output``: it has tools
    or MCP servers, whose results may be archived."""
    return bool(spec.tools or spec.toolsets)


def read_output_tool(spec: AgentSpec, cut: bool = True) -> ToolSpec | None:
    """The ``read_tool_output`` tool, for an agent with tools in a step
    whose prompt holds a view (``cut``) or on every step when the agent
    lists it in its ``tools`` (else None)."""
    if not (reads_outputs(spec) and (cut or READ_TOOL_OUTPUT in spec.tools)):
        return None
    limit = spec.tool_output_limit
    return ToolSpec(
        name=READ_TOOL_OUTPUT,
        description="Read part of a tool output that was too long to show whole. "
        "Its notice names the handle and the size; offset and length count characters.",
        parameters={
            "type": "object",
            "properties": {
                "handle": {"type": "string", "description": "the handle from the notice"},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "length": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": limit,
                    "default": limit,
                    "description": f"characters to read, at most {limit}",
                },
            },
            "required": ["handle"],
            "additionalProperties": False,
        },
    )


def archived(session: Session, root_id: str, handle: str) -> Any:
    """The archived result of call ``handle`` in the tree ``root_id``;
    LookupError if there is none (another tree's, or not archived)."""
    found = archived_result(session, root_id, handle)
    if found is None:
        raise LookupError(handle)
    return found[0]


def read_output(session: Session, root_id: str, params: dict[str, Any], limit: int) -> str:
    """A call of ``read_tool_output``: its slice, after a header. A
    :class:`ValueError` names what was wrong with the arguments (or the handle)."""
    handle, offset, length = params.get("handle"), params.get("offset", 0), params.get("length")
    if not isinstance(handle, str) or not handle:
        raise ValueError("handle must be the handle from a truncated output's notice")
    if length is None:
        length = limit
    for name, value, least in (("offset", offset, 0), ("length", length, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer of at least {least}, not {value!r}")
    try:
        text = output_text(archived(session, root_id, handle[:64]))
    except LookupError:
        raise ValueError(f"no archived tool output {handle[:64]!r} in this conversation") from None
    end = min(offset + min(length, limit), len(text))
    if offset >= len(text):
        return f"[offset {offset} is past the end: the output has {len(text)} characters]"
    return f"[characters {offset} to {end} of {len(text)}]\n{text[offset:end]}"
