"""Streaming OpenAI-protocol providers through the openai SDK directly.

litellm's stream wrapper costs ~8 ms CPU a call and ~0.3 ms a chunk on top
of the HTTP client; the openai SDK's stream costs ~1 ms. So for providers
whose chat endpoint *is* the OpenAI protocol, Chorus lets litellm do what it
is good at (resolve the provider, base URL and key; map and validate the
request parameters for that provider and model; price the usage) and then
streams with the openai SDK (a client per call in flight, kept for the
next call: :func:`_checkout`). Every other provider, and
any call whose ``model_settings`` ask for a litellm feature, stays on
litellm's path (:func:`route` returns None).

The decision is an explicit allow-list (:data:`SDK_PROVIDERS`), not a
guess: a provider is on it only if litellm itself talks to it with the
OpenAI client and no request or response rewriting Chorus relies on.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from orchestrator.llm.provider_errors import translating

if TYPE_CHECKING:
    from types import ModuleType

    import openai

#: litellm providers streamed through the openai SDK. ``openai`` covers any
#: ``openai/<model>`` with an ``api_base`` speaking the protocol (vLLM, Ollama's
#: ``/v1``, LM Studio, a LiteLLM proxy...). Not here: ``ollama``/``ollama_chat``
#: (Ollama's own /api protocol), and providers litellm rewrites requests or
#: replies for (Anthropic, Bedrock, Vertex, Gemini, Mistral's...).
SDK_PROVIDERS = frozenset({"openai", "azure", "hosted_vllm", "groq", "together_ai", "openrouter"})

#: ``model_settings`` keys the SDK path applies itself: to the client, the
#: headers, or the price. Every other litellm-only key (``mock_response``,
#: ``num_retries``, ``metadata``, ``fallbacks``...) keeps the call on litellm.
_CLIENT_KEYS = frozenset(
    {
        "api_base",
        "base_url",
        "api_version",
        "timeout",
        "max_retries",
        "extra_headers",
        "organization",
    }
)
_PRICE_KEYS = frozenset({"input_cost_per_token", "output_cost_per_token"})

#: Idle SDK clients a process keeps per endpoint: a worker process runs
#: ~150 calls at once.
MAX_IDLE = 256
#: Seconds an idle SDK client is kept (its connection's keep-alive is 5 s).
IDLE_SECONDS = 30.0
#: Connections one client may open: its call uses one (more only if a stream
#: was left unclosed).
_CONNECTIONS = 4

_OPENAI_BASE = "https://api.openai.com/v1"
_OPENROUTER_BASE = "https://openrouter.ai/api/v1"


@dataclass(frozen=True)
class Route:
    """Where and how the SDK path sends one call (resolved by litellm)."""

    provider: str
    model: str  # as the provider names it (no ``provider/`` prefix)
    base_url: str
    api_key: str = field(repr=False)
    api_version: str | None = None
    organization: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


def route(litellm: ModuleType, model: str, settings: dict[str, Any]) -> Route | None:
    """The SDK route of a call, or None when it must go through litellm."""
    from litellm.types.utils import all_litellm_params

    handled = _CLIENT_KEYS | _PRICE_KEYS
    if any(key in all_litellm_params and key not in handled for key in settings):
        return None
    base = settings.get("api_base") or settings.get("base_url")
    try:
        name, provider, dynamic_key, base = litellm.get_llm_provider(model, api_base=base)
    except Exception:  # litellm does not know it: its own path raises the clear error
        return None
    if provider not in SDK_PROVIDERS:
        return None
    if provider == "openai":
        return _openai(litellm, name, base, settings)
    if provider == "azure":
        return _azure(litellm, name, base, settings)
    if provider == "openrouter":
        return _openrouter(litellm, name, base)
    key = dynamic_key or litellm.api_key
    return Route(provider, name, base, key) if base and key else None


def _openai(
    litellm: ModuleType, name: str, base: str | None, settings: dict[str, Any]
) -> Route | None:
    key = litellm.api_key or litellm.openai_key or os.environ.get("OPENAI_API_KEY")
    base = (
        base
        or litellm.api_base
        or os.environ.get("OPENAI_BASE_URL")
        or os.environ.get("OPENAI_API_BASE")
        or _OPENAI_BASE
    )
    if not key or _bridged_to_responses(litellm, name, "openai", base, settings):
        return None
    organization = (
        settings.get("organization")
        or litellm.organization
        or os.environ.get("OPENAI_ORGANIZATION")
    )
    return Route("openai", name, base, key, organization=organization)


def _azure(
    litellm: ModuleType, name: str, base: str | None, settings: dict[str, Any]
) -> Route | None:
    key = (
        litellm.api_key
        or litellm.azure_key
        or os.environ.get("AZURE_OPENAI_API_KEY")
        or os.environ.get("AZURE_API_KEY")
    )
    base = base or litellm.api_base or os.environ.get("AZURE_API_BASE")
    version = (
        settings.get("api_version")
        or litellm.api_version
        or os.environ.get("AZURE_API_VERSION")
        or litellm.AZURE_DEFAULT_API_VERSION
    )
    # no key: Entra ID tokens and the like, which litellm obtains
    if not key or not base or _bridged_to_responses(litellm, name, "azure", base, settings):
        return None
    return Route("azure", name, base, key, api_version=version)


def _openrouter(litellm: ModuleType, name: str, base: str | None) -> Route | None:
    key = (
        litellm.api_key
        or litellm.openrouter_key
        or os.environ.get("OPENROUTER_API_KEY")
        or os.environ.get("OR_API_KEY")
    )
    if not key or litellm.OpenrouterConfig.get_config():  # configured extras: litellm applies them
        return None
    base = base or litellm.api_base or os.environ.get("OPENROUTER_API_BASE") or _OPENROUTER_BASE
    headers = (
        ("HTTP-Referer", os.environ.get("OR_SITE_URL") or "https://litellm.ai"),
        ("X-Title", os.environ.get("OR_APP_NAME") or "liteLLM"),
    )
    return Route("openrouter", name, base, key, headers=headers)


def _bridged_to_responses(
    litellm: ModuleType, name: str, provider: str, base: str, settings: dict[str, Any]
) -> bool:
    """True when litellm would send this chat call to the Responses API
    (some GPT-5 and ``mode: responses`` models): that is litellm's job."""
    try:
        info, _ = litellm.main.responses_api_bridge_check(
            model=name,
            custom_llm_provider=provider,
            reasoning_effort=settings.get("reasoning_effort"),
            api_base=base,
        )
    except Exception:  # a litellm without the check: stay on its path, to be safe
        return True
    return bool(info.get("mode") == "responses")


@contextmanager
def streaming(
    litellm: ModuleType,
    route: Route,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    settings: dict[str, Any],
) -> Iterator[openai.Stream[Any]]:
    """Send the request; the SDK stream yielded gives OpenAI chunks (dicts:
    :func:`_stream_class`) and is closed on leaving. Failures to send it are
    :class:`~orchestrator.errors.ModelError`.

    ``settings`` are mapped for the provider and model by litellm
    (``get_optional_params``, as litellm's own path does: ``max_tokens`` for
    o-series models, unsupported parameters refused or dropped, unknown keys
    sent in the body). ``max_retries`` defaults to 0 and ``stream_options``
    to ``{"include_usage": True}``, as on litellm's path.

    The call has an SDK client of its endpoint to itself until it leaves
    (:func:`_checkout`).
    """
    key, timeout, max_retries = _client_key(route, settings, litellm.request_timeout)
    client = _checkout(key, route, timeout, max_retries)
    try:
        with translating():
            stream = _post(client, *_request(litellm, route, model, tools, settings, messages))
        try:
            yield stream
        finally:
            stream.close()
    finally:
        _checkin(key, client)


def _request(
    litellm: ModuleType,
    route: Route,
    model: str,
    tools: list[dict[str, Any]] | None,
    settings: dict[str, Any],
    messages: list[dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The request's body, headers and extra body (see :func:`streaming`)."""
    _register_price(litellm, model, route.provider, settings)
    params = {k: v for k, v in settings.items() if k not in _CLIENT_KEYS | _PRICE_KEYS}
    params.setdefault("stream_options", {"include_usage": True})
    mapped = litellm.get_optional_params(
        model=route.model, custom_llm_provider=route.provider, stream=True, tools=tools, **params
    )
    extra_body = dict(mapped.pop("extra_body", None) or {})
    body: dict[str, Any] = {}
    for key, value in mapped.items():
        if key in {"max_retries", "stream", "model", "messages"}:
            continue
        if key in _create_parameters():
            body[key] = value
        else:
            extra_body[key] = value
    headers = {**dict(route.headers), **(settings.get("extra_headers") or {})}
    body = {**body, "model": route.model, "messages": messages, "stream": True}
    return body, headers, extra_body


def _post(
    client: openai.OpenAI,
    body: dict[str, Any],
    headers: dict[str, str],
    extra_body: dict[str, Any],
) -> openai.Stream[Any]:
    """``POST /chat/completions``, streamed, as ``chat.completions.create``
    sends it but without its recursive transform of the parameters: that
    walk of every message cost more CPU than the rest of the call (~5 ms
    for a 20-step history) and changes nothing in Chorus's plain JSON
    messages (no aliased keys, dates or files). litellm has already checked
    the parameters. An SDK without request security options takes
    ``create``'s own way."""
    from openai.types.chat import ChatCompletion

    options = _request_options(headers, extra_body)
    if options is None:
        create: Any = client.chat.completions.create
        fields = {k: v for k, v in body.items() if k != "stream"}
        stream: openai.Stream[Any] = create(
            **fields,
            stream=True,
            extra_headers=headers or None,
            extra_body=extra_body or None,
        )
        return stream
    return client.post(
        "/chat/completions",
        body=body,
        options=options,
        cast_to=ChatCompletion,
        stream=True,
        stream_cls=_stream_class(),
    )


@cache
def _stream_class() -> Any:
    """The SDK's stream of chunks, as the provider's JSON (plain dicts),
    reading the response to its end after ``data: [DONE]`` so that its
    connection goes back to the pool.

    Chunks stay dicts: building the SDK's ``ChatCompletionChunk`` of one
    (its recursive, validation-free ``construct``) cost ~45 µs of CPU, ~1 ms
    a call, thirty times the JSON parse; :mod:`orchestrator.llm.reply`
    reads dicts and objects alike.

    The SDK's own stream stops reading at ``[DONE]`` and closes the
    response there: the end of the body is still unread, so httpx cannot
    reuse the connection and closes it. Every call then opened a new
    connection (a TLS handshake, on a real provider). What follows
    ``[DONE]`` is only the body's end, which OpenAI-protocol servers send
    with it; an error reading it is ignored (the reply is whole; the
    connection is closed instead). A server that held the body open after
    ``[DONE]`` would hold the step like one that stalls before it, up to
    the call's read timeout. An SDK whose stream has no ``_iter_events``
    keeps its own behaviour (with dict chunks)."""
    from openai import Stream

    if not hasattr(Stream, "_iter_events"):
        return Stream[object]

    class _ReadToEnd(Stream[object]):
        def _iter_events(self) -> Any:
            events = super()._iter_events()
            for sse in events:
                if sse.data.startswith("[DONE]"):
                    # the reply is whole: a failure to read the end of the body
                    # (a dropped connection, a timeout) only costs the connection
                    with contextlib.suppress(Exception):
                        for _ in events:  # anything after [DONE] is ignored
                            pass
                yield sse

    return _ReadToEnd


def _request_options(headers: dict[str, str], extra_body: dict[str, Any]) -> Any:
    """The request options ``create`` would build (bearer auth, headers,
    extra body), or None with an SDK whose options have no ``security``."""
    from openai._base_client import make_request_options

    if "security" not in _options_parameters():
        return None
    return make_request_options(
        extra_headers=headers or None,
        extra_body=extra_body or None,
        security={"bearer_auth": True},
    )


@cache
def _options_parameters() -> frozenset[str]:
    from openai._base_client import make_request_options

    return frozenset(inspect.signature(make_request_options).parameters)


@cache
def _create_parameters() -> frozenset[str]:
    from openai.resources.chat.completions import Completions

    return frozenset(inspect.signature(Completions.create).parameters) - {"self", "extra_body"}


def _register_price(
    litellm: ModuleType, model: str, provider: str, settings: dict[str, Any]
) -> None:
    """Register a per-token price given in ``model_settings``, as litellm's
    path does for both prices given (priced later under ``model``)."""
    prices = {k: settings.get(k) for k in sorted(_PRICE_KEYS)}
    if any(v is None for v in prices.values()):
        return
    known = litellm.model_cost.get(model) or {}
    if all(known.get(k) == v for k, v in prices.items()):
        return
    litellm.register_model({model: {**prices, "litellm_provider": provider}})


_ClientKey = tuple[Any, ...]

#: Idle SDK clients, per endpoint, key and client options (:func:`_checkout`),
#: each with when it was returned, oldest first.
_idle: dict[_ClientKey, deque[tuple[float, openai.OpenAI]]] = {}
_idle_lock = threading.Lock()


def _client_key(
    route: Route, settings: dict[str, Any], default_timeout: Any
) -> tuple[_ClientKey, Any, int]:
    """(the key of the clients a call may use, its timeout, its retries)."""
    timeout = settings.get("timeout") or default_timeout
    max_retries = settings.get("max_retries", 0)
    key = (
        route.provider,
        route.base_url,
        route.api_key,
        route.api_version,
        route.organization,
        timeout,
        max_retries,
    )
    return key, timeout, max_retries


def _checkout(key: _ClientKey, route: Route, timeout: Any, max_retries: int) -> openai.OpenAI:
    """An SDK client for one call: an idle one of its endpoint (the latest
    returned, whose connection is the likeliest still open), or a new one.

    A client per call in flight, not one shared client: httpx's connection
    pool looks at every connection it holds, under one lock, whenever a
    request starts or ends (and at every idle one's socket, and counts the
    idle ones once per idle one), so with a worker's ~150 calls in flight
    one shared pool cost ~0.6 ms of CPU a call. A client holds the one
    connection its call uses, kept open for the next call that takes the
    client; a new client costs ~0.4 ms (with the process's one TLS
    context) and ~4 KB."""
    with _idle_lock:
        idle = _idle.get(key)
        if idle:
            return idle.pop()[1]
    return _new_client(route, timeout, max_retries)


def _checkin(key: _ClientKey, client: openai.OpenAI) -> None:
    """Keep ``client`` for the next call, up to :data:`MAX_IDLE` an endpoint;
    close the clients left idle past :data:`IDLE_SECONDS` (after a burst:
    their connections have expired, and the server has closed its end)."""
    now = time.monotonic()
    stale: list[openai.OpenAI] = []
    with _idle_lock:
        idle = _idle.setdefault(key, deque())
        while idle and (len(idle) >= MAX_IDLE or now - idle[0][0] > IDLE_SECONDS):
            stale.append(idle.popleft()[1])
        idle.append((now, client))
    for old in stale:
        old.close()


def _forget() -> None:
    """A forked child must not share its parent's connections."""
    global _idle_lock
    _idle_lock = threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_forget)


@cache
def _tls() -> ssl.SSLContext:
    """The process's TLS context, as httpx builds it by default (certifi's
    CAs, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``): building one per client
    cost ~17 ms."""
    import httpx

    return httpx.create_ssl_context()


def _new_client(route: Route, timeout: Any, max_retries: int) -> openai.OpenAI:
    import httpx
    import openai

    http = openai.DefaultHttpxClient(
        verify=_tls(),
        limits=httpx.Limits(max_connections=_CONNECTIONS, max_keepalive_connections=1),
    )
    if route.provider == "azure":
        return openai.AzureOpenAI(
            azure_endpoint=route.base_url,
            api_key=route.api_key,
            api_version=route.api_version,
            timeout=timeout,
            max_retries=max_retries,
            http_client=http,
        )
    return openai.OpenAI(
        base_url=route.base_url,
        api_key=route.api_key,
        organization=route.organization,
        timeout=timeout,
        max_retries=max_retries,
        http_client=http,
    )
