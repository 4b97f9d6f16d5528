"""A streamed reply, collected: the one place chunks become a :class:`ModelReply`.

Both client paths (litellm's stream wrapper, whose chunks are objects, and
the openai SDK's stream, whose chunks are the provider's JSON as dicts)
yield chunks with OpenAI streaming semantics, and both are read by
:func:`read_stream`: text, thinking, tool-call arguments assembled across
chunks, usage, finish reason, an early stop, and storable strings.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.llm.provider_errors import translating
from orchestrator.store.values import storable, storable_text, too_deep
from schemas.content import ToolCallBlock, Usage

if TYPE_CHECKING:
    from types import ModuleType

#: Key of ``ToolCallBlock.params`` when the model's arguments were not a JSON object.
INVALID_ARGUMENTS_KEY = "__invalid_arguments__"

#: Longest tool name or call id kept from a reply (the columns' size).
_ID_CHARS = 200

_END = object()


@dataclass(frozen=True)
class ModelReply:
    """What one model call produced.

    Attributes:
        text: The assistant text.
        tool_calls: Requested tool calls in order. ``params`` holds the parsed
            JSON arguments; arguments that are not a JSON object come as
            ``{"__invalid_arguments__": "<raw string>"}``.
        usage: Tokens and cost (``cost_usd`` is 0.0 when litellm cannot price
            the model).
        thinking: Reasoning text if the provider streamed it.
        finish_reason: The provider's finish reason ("" if none was sent).
            Informational: decide on ``tool_calls``, not on this.
        stopped: True if ``should_stop`` ended the stream early; then
            ``tool_calls`` is empty (partial calls are dropped) and ``text``
            is what arrived before the stop.
        first_token_at: ``time.monotonic()`` when the first piece of the
            reply (text, thinking or a tool call) arrived; None if none
            streamed. A timing, not part of what the reply says: two
            replies that say the same compare equal whenever they came.

    Every string in it can be stored: a NUL or lone surrogate the model
    sent is replaced (:mod:`orchestrator.store.values`).
    """

    text: str
    tool_calls: list[ToolCallBlock]
    usage: Usage
    thinking: str = ""
    finish_reason: str = ""
    stopped: bool = False
    first_token_at: float | None = field(default=None, compare=False)


def read_stream(
    litellm: ModuleType,
    model: str,
    stream: Any,
    on_delta: Callable[[str], None] | None,
    should_stop: Callable[[], bool] | None,
) -> ModelReply:
    """Read ``stream`` (an iterable of OpenAI-style chunks with a ``close``)
    to its end, or until ``should_stop`` says so (then it is closed).

    Failures of the stream become :class:`~orchestrator.errors.ModelError`;
    an exception of ``on_delta`` propagates unchanged. The usage is priced
    with litellm's cost map under ``model``.
    """
    collector = _Collector()
    chunks: Iterator[Any] = iter(stream)
    while True:
        if should_stop is not None and should_stop():
            close(stream)
            return collector.reply(litellm, model, stopped=True)
        with translating():
            chunk = next(chunks, _END)
        if chunk is _END:
            break
        piece = collector.add(chunk)
        if piece and on_delta is not None:
            on_delta(piece)
    return collector.reply(litellm, model)


@dataclass
class _PendingCall:
    id: str
    name: str = ""
    arguments: str = ""


@dataclass
class _Collector:
    """Accumulates streamed chunks (OpenAI streaming semantics)."""

    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[_PendingCall] = field(default_factory=list)
    by_index: dict[int, int] = field(default_factory=dict)
    usage: Any = None
    finish_reason: str = ""
    first_at: float | None = None

    def add(self, chunk: Any) -> str:
        """Take one chunk; return its text piece ("" if none). The first
        that carries any of the reply is timed (time to first token)."""
        usage = _field(chunk, "usage")
        if usage is not None:
            self.usage = usage
        choices = _field(chunk, "choices")
        if not choices:
            return ""
        choice = choices[0]
        finish_reason = _field(choice, "finish_reason")
        if finish_reason:
            self.finish_reason = str(finish_reason)
        delta = _field(choice, "delta")
        if delta is None:
            return ""
        reasoning = _field(delta, "reasoning_content")
        if reasoning:
            self.thinking.append(reasoning)
        calls = _field(delta, "tool_calls") or []
        for tool_call in calls:
            self._add_tool_call(tool_call)
        piece = _field(delta, "content") or ""
        if piece:
            self.text.append(piece)
        if self.first_at is None and (piece or reasoning or calls):
            self.first_at = time.monotonic()
        return piece

    def _add_tool_call(self, delta: Any) -> None:
        # OpenAI sends id and name once, then argument pieces under the same
        # index. Some providers send several complete calls all at index 0
        # with distinct ids: a new id at a known index starts a new call.
        index = _field(delta, "index")
        if index is None:
            index = len(self.calls)
        position = self.by_index.get(index)
        new_id = _field(delta, "id")
        if position is None or (new_id and new_id != self.calls[position].id):
            self.calls.append(_PendingCall(id=new_id or f"call_{uuid.uuid4().hex}"))
            position = self.by_index[index] = len(self.calls) - 1
        pending = self.calls[position]
        function = _field(delta, "function")
        if function is not None:
            name = _field(function, "name")
            if name:
                pending.name = name
            arguments = _field(function, "arguments")
            if arguments:
                pending.arguments += arguments

    def reply(self, litellm: ModuleType, model: str, stopped: bool = False) -> ModelReply:
        """The collected reply (partial tool calls dropped when stopped)."""
        calls = [] if stopped else [_to_block(c) for c in self.calls]
        return ModelReply(
            text=storable_text("".join(self.text)),
            tool_calls=calls,
            usage=_usage(litellm, model, self.usage),
            thinking=storable_text("".join(self.thinking)),
            finish_reason=self.finish_reason,
            stopped=stopped,
            first_token_at=self.first_at,
        )


def _to_block(pending: _PendingCall) -> ToolCallBlock:
    return ToolCallBlock(
        tool_request_id=storable_text(pending.id)[:_ID_CHARS],
        tool=storable_text(pending.name)[:_ID_CHARS],
        params=parse_arguments(pending.arguments),
    )


def parse_arguments(arguments: str) -> dict[str, Any]:
    """Parse tool-call arguments; a non-object, or one nested deeper than
    :data:`~orchestrator.store.values.MAX_DEPTH`, becomes
    ``{"__invalid_arguments__": raw}``. The result is storable
    (:func:`~orchestrator.store.values.storable`: no NUL, no NaN).

    An empty string means no arguments (``{}``), as some providers send it.
    """
    if not arguments.strip():
        return {}
    invalid = {INVALID_ARGUMENTS_KEY: storable_text(arguments)}
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return invalid
    if not isinstance(value, dict) or too_deep(value):
        return invalid
    cleaned: dict[str, Any] = storable(value)
    return cleaned


def _field(value: Any, name: str) -> Any:
    """A field of a chunk or of a part of one: the SDK path's chunks are the
    provider's JSON (dicts), litellm's are objects; missing is None, and so
    is any field of a JSON value that is not an object (a malformed chunk's
    string has no ``index``)."""
    if isinstance(value, dict):
        return value.get(name)
    if value is None or isinstance(value, (str, int, float, list)):
        return None
    return getattr(value, name, None)


def _usage(litellm: ModuleType, model: str, usage: Any) -> Usage:
    if usage is None:
        return Usage()
    input_tokens = int(_field(usage, "prompt_tokens") or 0)
    output_tokens = int(_field(usage, "completion_tokens") or 0)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=_cost(litellm, model, usage),
    )


def _cost(litellm: ModuleType, model: str, usage: Any) -> float:
    """Price the call with litellm's cost map; 0.0 when it cannot.

    The SDK path's usage (the provider's JSON, or the SDK's pydantic model)
    becomes the ``litellm.Usage`` litellm's own stream would have built
    from it.
    """
    try:
        if not isinstance(usage, litellm.Usage) and hasattr(usage, "model_dump"):
            usage = usage.model_dump(exclude_none=True)
        if isinstance(usage, dict):
            usage = litellm.Usage(**{k: v for k, v in usage.items() if v is not None})
        # what completion_cost ends in, at a fifth of its CPU (~0.06 ms)
        prompt, completion = litellm.cost_per_token(model=model, usage_object=usage)
        return float(prompt + completion)
    except Exception:
        return 0.0


def close(stream: Any) -> None:
    """Best-effort close of an abandoned stream (releases the HTTP connection)."""
    for target in (getattr(stream, "completion_stream", None), stream):
        method = getattr(target, "close", None)
        if callable(method):
            with suppress(Exception):
                method()
            return
