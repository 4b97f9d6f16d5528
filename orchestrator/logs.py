"""Logging: text or JSON lines, each carrying the ids of the work it is about.

Every line logged while a task runs carries ``conversation_id``,
``root_id``, ``turn_id``, ``correlation_id`` (and ``step``/``tool`` where
known), bound with :func:`bind`. Credentials in URLs, ``api_key=…``-style
pairs and provider keys (``sk-…``) are redacted from every line.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

_context: ContextVar[dict[str, Any] | None] = ContextVar("chorus_log_context", default=None)

_SECRETS = (
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]+@", re.I), r"\1***@"),
    (
        re.compile(
            r"((?:api[_-]?key|password|passwd|secret|token|authorization)[\"']?\s*[:=]\s*[\"']?)"
            r"(?:bearer\s+)?[^\"'\s,;}]+",
            re.I,
        ),
        r"\1***",
    ),
    (re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_-]{8,}"), r"\1-***"),
)


def redact(text: str) -> str:
    """Mask credentials in ``text``."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


@contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """A fresh context for one task run: bindings do not leak to the next."""
    token = _context.set(dict(ids))
    try:
        yield
    finally:
        _context.reset(token)


def bind(**ids: Any) -> None:
    """Add ids to the current context (inside :func:`log_context`)."""
    current = _context.get()
    if current is not None:
        current.update({k: v for k, v in ids.items() if v is not None})


def current_ids() -> dict[str, Any]:
    return dict(_context.get() or {})


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.chorus = current_ids()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, ids, exception."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
            **getattr(record, "chorus", {}),
        }
        if record.exc_info:
            payload["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        ids = getattr(record, "chorus", {})
        line = redact(super().format(record))
        if ids:
            line += " [" + " ".join(f"{k}={v}" for k, v in ids.items()) + "]"
        return line


def setup_logging(level: str | int = "INFO", fmt: str = "text") -> None:
    """Send every log line to stderr as text or JSON (``CHORUS_LOG_FORMAT``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if isinstance(level, int) else level.upper())
    for noisy in ("httpx", "LiteLLM", "litellm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
