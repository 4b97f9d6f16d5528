"""Logging: text or JSON lines, each carrying the ids of the work it is about.

Every line logged while a task runs carries ``conversation_id``,
``root_id``, ``turn_id``, ``correlation_id`` (and ``step``/``tool`` where
known), bound with :func:`bind`.

:func:`redact` is the one redaction of Chorus: log lines, and every error
text that is stored, published or shown to a model (a tool's exception, a
model call's failure, a failed turn), go through it. It masks credentials
by shape (in URLs, ``api_key=…``-style pairs, provider and GitHub tokens)
and by value: the values of the credentials this process holds in its
environment (:func:`redact_credentials`, which also cleans whatever a model
or a tool produces before it is stored, see
:func:`orchestrator.store.values.storable_text`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

_context: ContextVar[dict[str, Any] | None] = ContextVar("chorus_log_context", default=None)

#: A URL's user and password (``redis://:PASSWORD@host``). Linear in the
#: text, since tool errors and provider bodies can be anyone's: the scheme
#: is at most 32 characters and neither part crosses a ``/`` (which a URL's
#: user part cannot hold), so no two tries scan the same characters (an
#: unbounded scheme and a password running to the next ``@`` took 4 s on
#: 80 KB of ``a://:``, quadratic).
_URL_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]{0,31}://[^:/@\s]*:)([^@\s/]+)@", re.I)

_SECRETS = (
    (_URL_CREDENTIALS, r"\1***@"),
    (
        re.compile(
            r"((?:api[_-]?key|password|passwd|secret|token|authorization)[\"']?\s*[:=]\s*[\"']?)"
            r"(?:bearer\s+)?[^\"'\s,;}]+",
            re.I,
        ),
        r"\1***",
    ),
    (re.compile(r"\b(sk|rk|pk|xox[abposr])-[A-Za-z0-9_-]{8,}"), r"\1-***"),
    # GitHub (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_), Groq, Hugging Face
    (re.compile(r"\b(gh[pousr]|gsk|hf)_[A-Za-z0-9]{20,}"), r"\1_***"),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), "github_pat_***"),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), r"\1***"),  # AWS access key ids
    # Chorus's API tokens (chorus_<prefix>_<secret>): the prefix is shown, as the token list does
    (re.compile(r"\b(chorus_[0-9a-f]{8}_)[0-9a-f]{16,}"), r"\1***"),
)

#: An environment variable holds a credential when a word of its name
#: (split at ``_``) is one of these: ``OPENAI_API_KEY``, ``GROQ_API_KEY``,
#: ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``POSTGRES_PASSWORD``,
#: ``FLOWER_BASIC_AUTH``, ``VERTEXAI_CREDENTIALS``.
_CREDENTIAL_NAME = re.compile(
    r"(?:^|_)(?:KEY|APIKEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|AUTH|CREDENTIALS?)(?:_|$)", re.I
)
#: Shortest value redacted by value; a value must also mix two kinds of
#: characters (letters and digits, lower and upper case, or symbols), so
#: that ``true`` or ``standard`` in an ``AUTH_MODE`` never masks the word
#: wherever it appears.
MIN_CREDENTIAL_CHARS = 8
#: What a credential's value becomes.
MASK = "***"

#: Names registered as credentials whatever their name says (the variables
#: an MCP server's headers are read from).
_named: set[str] = set()
#: (environment size, registrations) the values below were read for.
_built: tuple[tuple[int, int], tuple[str, ...]] = ((-1, -1), ())


def _credential_like(word: str) -> bool:
    if len(word) < MIN_CREDENTIAL_CHARS:
        return False
    kinds = (str.islower, str.isupper, str.isdigit)
    present = sum(any(kind(c) for c in word) for kind in kinds)
    return present + any(not c.isalnum() for c in word) >= 2


def credential_values(environ: Mapping[str, str], named: Iterable[str] = ()) -> set[str]:
    """The values in ``environ`` that are credentials: those of the variables
    whose name says so (or listed in ``named``), and the words of a short
    one (an ``Authorization`` value ``Bearer …`` gives its token; a JSON
    document does not give each of its words), and the passwords of URLs
    in any variable."""
    extra = set(named)
    found: set[str] = set()
    for name, value in environ.items():
        if _CREDENTIAL_NAME.search(name) or name in extra:
            words = value.split()
            found.update([value.strip(), *(words if len(words) <= 3 else ())])
        found.update(m.group(2) for m in _URL_CREDENTIALS.finditer(value))
    return {v for v in found if _credential_like(v)}


def treat_as_credentials(names: Iterable[str]) -> None:
    """Redact the values of the environment variables ``names`` too."""
    global _built
    _named.update(names)
    _built = ((-1, -1), ())


def _credentials() -> tuple[str, ...]:
    """The values of this process's credentials, longest first, read again
    when a variable is added or removed (litellm may load a ``.env``)."""
    global _built
    key = (len(os.environ), len(_named))
    if _built[0] != key:
        values = sorted(credential_values(os.environ, _named), key=len, reverse=True)
        _built = (key, tuple(values))
    return _built[1]


def redact_credentials(text: str) -> str:
    """``text`` with the value of every credential this process holds
    masked, whatever its shape. (A substring search a value: a few tens of
    nanoseconds on a streamed delta, where a regular expression of the
    values took microseconds.)"""
    for value in _credentials():
        if value in text:
            text = text.replace(value, MASK)
    return text


class StreamRedaction:
    """:func:`redact_credentials` of a text that arrives in pieces (a
    model's streamed deltas): each piece alone may hold part of a credential
    and the next piece the rest, so the end of what was fed that could begin
    a credential is held back until the next piece (or :meth:`end`) says
    whether it does."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        """What of the text so far may be published now, redacted."""
        text = redact_credentials(self._held + text)
        cut = len(text)
        for value in _credentials():
            start = max(0, len(text) - len(value) + 1)
            while (found := text.find(value[0], start, cut)) != -1:
                if value.startswith(text[found:]):
                    cut = found
                    break
                start = found + 1
        self._held = text[cut:]
        return text[:cut]

    def end(self) -> str:
        """The rest, at the end of the stream (no credential: a prefix of one
        at most, as the stored text holds it)."""
        held, self._held = self._held, ""
        return held


def redact(text: str) -> str:
    """Mask credentials in ``text``: by shape, then by value."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return redact_credentials(text)


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


class RedactingFilter(logging.Filter):
    """Redacts a record's string arguments: for loggers Chorus does not
    format itself (uvicorn's access log prints each request's path and
    query, where a client may have put a token)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        record.msg = redact(record.msg) if isinstance(record.msg, str) else record.msg
        return True


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
