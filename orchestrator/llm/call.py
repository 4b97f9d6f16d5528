"""The one place Chorus calls a model: through litellm, or the openai SDK.

``import litellm`` costs ~5 s and ~160 MB, so it happens lazily inside
:func:`complete`, never at module import (``chorus --help`` stays fast).
Before that import ``LITELLM_LOCAL_MODEL_COST_MAP`` defaults to ``True`` so
litellm does not fetch its cost map from the internet.

Two paths, one behaviour. litellm reaches every provider and prices every
call; for OpenAI-protocol providers (:mod:`orchestrator.llm.openai_stream`)
the stream itself goes through the openai SDK, after litellm has resolved
the provider, base URL and key and mapped the parameters, because litellm's
stream wrapper costs ~8 ms CPU a call more. ``CHORUS_MODEL_CLIENT=litellm``
keeps every call on litellm's path. Both paths read the stream with
:func:`orchestrator.llm.reply.read_stream` and raise the same
:class:`~orchestrator.errors.ModelError` (:mod:`orchestrator.llm.provider_errors`).

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
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from orchestrator import tracing
from orchestrator.errors import ConfigurationError, ModelError
from orchestrator.llm import openai_stream
from orchestrator.llm.provider_errors import is_retryable, translating
from orchestrator.llm.reply import INVALID_ARGUMENTS_KEY, ModelReply, parse_arguments, read_stream
from orchestrator.tools.names import alias
from schemas.content import (
    Message,
    Role,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from schemas.specs import ToolSpec

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "INVALID_ARGUMENTS_KEY",
    "ModelReply",
    "complete",
    "is_retryable",
    "model_client",
    "model_path",
    "parse_arguments",
    "to_openai_messages",
    "tool_to_openai",
    "warm",
]

log = logging.getLogger(__name__)

#: Values of ``CHORUS_MODEL_CLIENT`` (see :class:`orchestrator.settings.Settings`).
MODEL_CLIENTS = ("auto", "litellm")


def _litellm() -> ModuleType:
    """Import litellm lazily, without the cost-map fetch and the stdout chatter."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def model_client() -> str:
    """``CHORUS_MODEL_CLIENT``: ``auto`` (the openai SDK streams OpenAI-protocol
    providers) or ``litellm`` (every call through litellm). Read at each call."""
    value = os.environ.get("CHORUS_MODEL_CLIENT", "").strip().lower() or "auto"
    if value not in MODEL_CLIENTS:
        raise ConfigurationError(f"CHORUS_MODEL_CLIENT={value!r}: expected one of {MODEL_CLIENTS}")
    return value


_warm_lock = threading.Lock()
_warmed = False


def warm() -> None:
    """Load the model client in this process, once: litellm, the scripted
    provider, and what each path's first HTTP call imports (litellm's openai
    provider, the openai SDK, httpx's transport: ~1 s, more under load).

    A rate limit admits a call at the moment it is sent, so that first-call
    cost must be paid before admission: workers call this before they
    report ready, and every step before it asks the limiter. The warm-up is
    one call per path to a local port that refuses it (a socket bound, not
    listening): no request leaves the machine.
    """
    global _warmed
    with _warm_lock:
        if _warmed:
            return
        began = time.monotonic()
        litellm = _litellm()
        from orchestrator.llm import scripted

        scripted.install()
        try:
            _refused_calls(litellm)
        except Exception:  # a warm-up is best effort: the first real call pays instead
            log.warning("model client warm-up failed", exc_info=True)
        _warmed = True
        log.info("model client loaded in %.2f s", time.monotonic() - began)


def _refused_calls(litellm: ModuleType) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        model = "openai/chorus-warm-up"
        messages = [{"role": "user", "content": "."}]
        settings = {"api_base": base, "api_key": "warm-up", "timeout": 5}
        with suppress(ModelError):  # api_key: a litellm-only setting, so litellm's path
            complete(model, messages, None, settings)
        route = openai_stream.Route("openai", "chorus-warm-up", base, "warm-up")
        with (
            suppress(ModelError),
            openai_stream.streaming(litellm, route, model, messages, None, {}) as stream,
        ):
            read_stream(litellm, model, stream, None, None)


def model_path(model: str, model_settings: dict[str, Any]) -> str:
    """Which client :func:`complete` sends this call through: ``"openai-sdk"``
    or ``"litellm"`` (see :mod:`orchestrator.llm.openai_stream`)."""
    litellm = _litellm()
    return "openai-sdk" if _sdk_route(litellm, model, model_settings) else "litellm"


def _sdk_route(
    litellm: ModuleType, model: str, model_settings: dict[str, Any]
) -> openai_stream.Route | None:
    if model_client() != "auto":
        return None
    return openai_stream.route(litellm, model, model_settings)


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
        ModelError: The provider, litellm or the openai SDK failed
            (``status`` and ``body`` kept when there were any).
    """
    with tracing.model_call(model, messages, tools, model_settings) as span:
        reply = _streamed(model, messages, tools, model_settings, on_delta, should_stop)
        span.reply(reply)
    return reply


def _streamed(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    model_settings: dict[str, Any],
    on_delta: Callable[[str], None] | None,
    should_stop: Callable[[], bool] | None,
) -> ModelReply:
    litellm = _litellm()
    from orchestrator.llm import scripted

    scripted.install()
    sdk = _sdk_route(litellm, model, model_settings)
    if sdk is not None:
        with openai_stream.streaming(
            litellm, sdk, model, messages, tools or None, model_settings
        ) as stream:
            return read_stream(litellm, model, stream, on_delta, should_stop)
    with translating():
        stream = _litellm_stream(litellm, model, messages, tools, model_settings)
    return read_stream(litellm, model, stream, on_delta, should_stop)


def _litellm_stream(
    litellm: ModuleType,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    model_settings: dict[str, Any],
) -> Any:
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
    return litellm.completion(**kwargs)


# --- conversion from the content model ------------------------------------


def tool_to_openai(spec: ToolSpec, name: str | None = None) -> dict[str, Any]:
    """A tool spec as an OpenAI ``tools=`` entry, offered as ``name`` (by
    default the provider-legal alias of its name, :mod:`orchestrator.tools.names`)."""
    return {
        "type": "function",
        "function": {
            "name": name or alias(spec.name),
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def to_openai_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    """Convert Chorus messages to OpenAI chat messages.

    - Tool names (of calls and results) are their provider-legal aliases
      (:func:`orchestrator.tools.names.alias`; :func:`openai_messages` takes
      another mapping).
    - ``system`` (if not empty) becomes the first, ``system`` message.
    - Assistant messages carry their text (joined) and ``tool_calls`` with
      JSON-dumped arguments; no ``content`` key when there is no text but
      there are tool calls (as litellm sends it: both paths send the same).
      Params holding ``__invalid_arguments__`` go back as that JSON object, not the raw
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


def openai_messages(message: Message, name: Callable[[str], str] = alias) -> list[dict[str, Any]]:
    """One Chorus message as OpenAI chat messages (see :func:`to_openai_messages`);
    ``name`` gives the name the model sees for a tool's qualified name."""
    texts = [b.text for b in message.content if isinstance(b, TextBlock)]
    results = [_tool_message(b, name) for b in message.content if isinstance(b, ToolResultBlock)]
    if message.role == Role.ASSISTANT:
        return [_assistant_message(texts, message.tool_calls, name), *results]
    return [*results, *([{"role": "user", "content": "\n\n".join(texts)}] if texts else [])]


def _assistant_message(
    texts: list[str], calls: list[ToolCallBlock], name: Callable[[str], str]
) -> dict[str, Any]:
    text = "".join(texts)
    entry: dict[str, Any] = {"role": "assistant"}
    if text or not calls:
        entry["content"] = text
    if calls:
        entry["tool_calls"] = [
            {
                "id": c.tool_request_id,
                "type": "function",
                "function": {"name": name(c.tool), "arguments": json.dumps(c.params, default=str)},
            }
            for c in calls
        ]
    return entry


def _tool_message(block: ToolResultBlock, name: Callable[[str], str]) -> dict[str, Any]:
    result = block.result
    content = result if isinstance(result, str) else json.dumps(result, default=str)
    return {
        "role": "tool",
        "tool_call_id": block.tool_request_id,
        "name": name(block.tool),
        "content": content,
    }
