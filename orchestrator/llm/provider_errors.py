"""How a failed model call becomes a :class:`~orchestrator.errors.ModelError`.

One translation for both client paths (litellm and the openai SDK): the
status is the provider's HTTP status when there was a response, None when
there was none (connection refused or reset, timeout), and ``retryable``
covers rate limits, timeouts, connection errors and every 5xx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.errors import ModelError
from orchestrator.store.values import storable_text

#: Statuses worth retrying: timeout, conflict, rate limit, and every 5xx.
_RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable(exc: BaseException) -> bool:
    """Whether a litellm or openai failure is worth retrying (rate limit,
    timeout, connection, 5xx)."""
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
def translating() -> Iterator[None]:
    """Re-raise litellm/openai/httpx errors as :class:`ModelError`; others unchanged.

    Others (a Celery soft time limit, a bug) must not pass for a model failure.
    """
    try:
        yield
    except Exception as exc:
        if not _from_llm_stack(exc):
            raise
        raise translate(exc) from exc


def _from_llm_stack(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.split(".", 1)[0] in {"litellm", "openai", "httpx"}


def translate(exc: BaseException) -> ModelError:
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
