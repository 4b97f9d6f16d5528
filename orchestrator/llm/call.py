"""The one place Chorus calls litellm.

``import litellm`` costs ~5 s and ~160 MB, so it happens lazily inside
:func:`complete`, never at module import (``chorus --help`` stays fast).
Before that import ``LITELLM_LOCAL_MODEL_COST_MAP`` defaults to ``True`` so
litellm does not fetch its cost map from the internet.

Every call streams (``stream=True``) with ``stream_options={"include_usage":
True}``: litellm never rejects ``stream_options`` for any provider (it is in
``litellm.utils.PROVIDER_UNVALIDATED_PARAMS``) and its stream wrapper uses it
to emit a final usage chunk for every provider. ``max_retries`` defaults to
0 so that retries are Chorus's decision, not the provider SDK's hidden
backoff. Both can be overridden through ``model_settings``.

Whether the model wants tools is decided on the presence of tool calls,
never on ``finish_reason`` (litellm's mock tool calls report ``stop``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelError
from orchestrator.store.values import storable, storable_text, too_deep
from schemas.content import (
    Message,
    Role,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    Usage,
)
from schemas.specs import ToolSpec

if TYPE_CHECKING:
    from types import ModuleType

#: Key of ``ToolCallBlock.params`` when the model's arguments were not a JSON object.
INVALID_ARGUMENTS_KEY = "__invalid_arguments__"

#: Statuses worth retrying: timeout, conflict, rate limit, and every 5xx.
_RETRYABLE_STATUSES = frozenset({408, 409, 429})

_END = object()

log = logging.getLogger(__name__)

#: Longest tool name or call id kept from a reply (the columns' size).
_ID_CHARS = 200


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

    Every string in it can be stored: a NUL or lone surrogate the model
    sent is replaced (:mod:`orchestrator.store.values`).
    """

    text: str
    tool_calls: list[ToolCallBlock]
    usage: Usage
    thinking: str = ""
    finish_reason: str = ""
    stopped: bool = False


def _litellm() -> ModuleType:
    """Import litellm lazily, without the cost-map fetch and the stdout chatter."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


_warm_lock = threading.Lock()
_warmed = False


def warm() -> None:
    """Load the model client in this process, once: litellm, the scripted
    provider, and what litellm's first HTTP call imports (the openai
    provider, httpx's transport: ~1 s, more under load).

    A rate limit admits a call at the moment it is sent, so that first-call
    cost must be paid before admission: workers call this before they
    report ready, and every step before it asks the limiter. The warm-up is
    one call to a local port that refuses it (a socket bound, not
    listening): no request leaves the machine.
    """
    global _warmed
    with _warm_lock:
        if _warmed:
            return
        began = time.monotonic()
        _litellm()
        from orchestrator.llm import scripted

        scripted.install()
        try:
            _refused_call()
        except Exception:  # a warm-up is best effort: the first real call pays instead
            log.warning("model client warm-up failed", exc_info=True)
        _warmed = True
        log.info("model client loaded in %.2f s", time.monotonic() - began)


def _refused_call() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        settings = {"api_base": base, "api_key": "warm-up", "timeout": 5}
        with suppress(ModelError):
            complete("openai/chorus-warm-up", [{"role": "user", "content": "."}], None, settings)


def complete(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    model_settings: dict[str, Any],
    on_delta: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ModelReply:
    """Call the model once, streaming, and collect its reply.

    Args:
        model: A litellm model string (``openai/gpt-4o``, ``scripted/demo``...).
        messages: OpenAI-format chat messages (see :func:`to_openai_messages`).
        tools: OpenAI-format tool definitions (see :func:`tool_to_openai`), or
            None/empty for no tools.
        model_settings: Extra litellm arguments (``temperature``,
            ``api_base``...). They override Chorus's defaults.
        on_delta: Called with each piece of assistant text as it streams.
            Exceptions it raises propagate unchanged.
        should_stop: Polled before each chunk; when it returns True the stream
            is closed and the partial reply returned with ``stopped=True``.

    Returns:
        The reply: text, tool calls, usage, thinking.

    Raises:
        ModelError: The provider or litellm failed (``status`` and ``body``
            kept when there were any).
    """
    litellm = _litellm()
    from orchestrator.llm import scripted

    scripted.install()
    kwargs: dict[str, Any] = {
        "stream_options": {"include_usage": True},
        "max_retries": 0,
        **model_settings,
        "model": model,
        "messages": messages,
        "stream": True,
    }
    if tools:
        kwargs["tools"] = tools
    with _translating():
        stream = litellm.completion(**kwargs)
    collector = _Collector()
    chunks: Iterator[Any] = iter(stream)
    while True:
        if should_stop is not None and should_stop():
            _close(stream)
            return collector.reply(litellm, model, stopped=True)
        with _translating():
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

    def add(self, chunk: Any) -> str:
        """Take one chunk; return its text piece ("" if none)."""
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        if not chunk.choices:
            return ""
        choice = chunk.choices[0]
        if choice.finish_reason:
            self.finish_reason = str(choice.finish_reason)
        delta = choice.delta
        if delta is None:
            return ""
        reasoning = getattr(delta, "reasoning_content", None)
        if reasoning:
            self.thinking.append(reasoning)
        for tool_call in delta.tool_calls or []:
            self._add_tool_call(tool_call)
        piece = delta.content or ""
        if piece:
            self.text.append(piece)
        return piece

    def _add_tool_call(self, delta: Any) -> None:
        # OpenAI sends id and name once, then argument pieces under the same
        # index. Some providers send several complete calls all at index 0
        # with distinct ids: a new id at a known index starts a new call.
        index = delta.index if delta.index is not None else len(self.calls)
        position = self.by_index.get(index)
        new_id = getattr(delta, "id", None)
        if position is None or (new_id and new_id != self.calls[position].id):
            self.calls.append(_PendingCall(id=new_id or f"call_{uuid.uuid4().hex}"))
            position = self.by_index[index] = len(self.calls) - 1
        pending = self.calls[position]
        function = delta.function
        if function is not None:
            if function.name:
                pending.name = function.name
            if function.arguments:
                pending.arguments += function.arguments

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


def _usage(litellm: ModuleType, model: str, usage: Any) -> Usage:
    if usage is None:
        return Usage()
    input_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    output_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=_cost(litellm, model, usage),
    )


def _cost(litellm: ModuleType, model: str, usage: Any) -> float:
    """Price the call with litellm's cost map; 0.0 when it cannot."""
    try:
        response = litellm.ModelResponse(model=model, usage=usage)
        return float(litellm.completion_cost(completion_response=response, model=model))
    except Exception:
        return 0.0


def _close(stream: Any) -> None:
    """Best-effort close of an abandoned stream (releases the HTTP connection)."""
    for target in (getattr(stream, "completion_stream", None), stream):
        close = getattr(target, "close", None)
        if callable(close):
            with suppress(Exception):
                close()
            return


def is_retryable(exc: BaseException) -> bool:
    """Whether a litellm failure is worth retrying (rate limit, timeout, connection, 5xx)."""
    import openai

    if _transport_failure(exc) or isinstance(exc, openai.RateLimitError):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status in _RETRYABLE_STATUSES or status >= 500)


def _transport_failure(exc: BaseException) -> bool:
    """True if no HTTP response was received (connection refused/reset, timeout).

    litellm reports some of these with a made-up status: the openai provider
    turns a refused connection into ``InternalServerError`` (500), Anthropic
    too, ``Timeout`` says 408. The cause chain still holds the transport error.
    """
    import httpx
    import openai

    transport = (openai.APIConnectionError, httpx.TransportError, ConnectionError, TimeoutError)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, transport):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def _translating() -> Iterator[None]:
    """Re-raise litellm/openai/httpx errors as :class:`ModelError`; others unchanged.

    Others (a Celery soft time limit, a bug) must not pass for a model failure.
    """
    try:
        yield
    except Exception as exc:
        if not _from_llm_stack(exc):
            raise
        raise _translate(exc) from exc


def _from_llm_stack(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.split(".", 1)[0] in {"litellm", "openai", "httpx"}


def _translate(exc: BaseException) -> ModelError:
    """Turn a litellm (or openai/httpx) exception into a :class:`ModelError`.

    ``status`` is the provider's HTTP status when there was a response; it is
    None for connection errors and timeouts (litellm fakes 500/408 there, see
    :func:`_transport_failure`).
    ``body`` is the response body when available, else the message.
    """
    status = getattr(exc, "status_code", None)
    if _transport_failure(exc) or not isinstance(status, int):
        status = None
    message = str(exc) or type(exc).__name__
    if type(exc).__name__ not in message:
        message = f"{type(exc).__name__}: {message}"
    return ModelError(
        storable_text(message),  # stored in llm.failed events and the turn's error
        status=status,
        body=storable_text(_body(exc, message)),
        retryable=is_retryable(exc),
    )


def _body(exc: BaseException, fallback: str) -> str:
    response = getattr(exc, "response", None)
    try:
        text = response.text if response is not None else ""
    except Exception:  # streamed or unread response
        text = ""
    if text:
        return str(text)
    body = getattr(exc, "body", None)
    if body is not None:
        return body if isinstance(body, str) else json.dumps(body, default=str)
    return fallback


# --- conversion from the content model ------------------------------------


def tool_to_openai(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as an OpenAI ``tools=`` entry."""
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def to_openai_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    """Convert Chorus messages to OpenAI chat messages.

    - ``system`` (if not empty) becomes the first, ``system`` message.
    - Assistant messages carry their text (joined) and ``tool_calls`` with
      JSON-dumped arguments; content is None when there is no text but
      there are tool calls (litellm then drops the key). Params holding
      ``__invalid_arguments__`` go back as that JSON object, not the raw
      string, so providers that parse past arguments accept the history.
    - ``tool_result`` blocks become ``tool`` messages (``tool_call_id``, the
      tool's ``name`` as OpenAI's examples and some litellm providers use it,
      content = the result, JSON-dumped unless it is a string). In a user
      message they come before the user's text, as OpenAI requires tool
      messages right after the assistant message that called them.
    - User text blocks become the user message content (joined by blank lines).
    - ``thinking`` and ``raw`` blocks are skipped; a user message with
      nothing left is dropped.
    """
    out = system_message(system)
    for message in messages:
        out.extend(openai_messages(message))
    return out


def system_message(system: str) -> list[dict[str, Any]]:
    """The request's leading ``system`` message: none for an empty prompt."""
    return [{"role": "system", "content": system}] if system else []


def openai_messages(message: Message) -> list[dict[str, Any]]:
    """One Chorus message as OpenAI chat messages (see :func:`to_openai_messages`)."""
    texts = [b.text for b in message.content if isinstance(b, TextBlock)]
    results = [_tool_message(b) for b in message.content if isinstance(b, ToolResultBlock)]
    if message.role == Role.ASSISTANT:
        return [_assistant_message(texts, message.tool_calls), *results]
    return [*results, *([{"role": "user", "content": "\n\n".join(texts)}] if texts else [])]


def _assistant_message(texts: list[str], calls: list[ToolCallBlock]) -> dict[str, Any]:
    text = "".join(texts)
    entry: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        entry["tool_calls"] = [
            {
                "id": c.tool_request_id,
                "type": "function",
                "function": {"name": c.tool, "arguments": json.dumps(c.params, default=str)},
            }
            for c in calls
        ]
    return entry


def _tool_message(block: ToolResultBlock) -> dict[str, Any]:
    result = block.result
    content = result if isinstance(result, str) else json.dumps(result, default=str)
    return {
        "role": "tool",
        "tool_call_id": block.tool_request_id,
        "name": block.tool,
        "content": content,
    }
