"""What Chorus can store: text without NUL, finite JSON, bounded nesting.

Postgres ``text`` and ``jsonb`` cannot hold the NUL character (U+0000) and
psycopg cannot encode a lone UTF-16 surrogate; ``jsonb`` has no NaN or
Infinity; events are serialized by pydantic, which stops at 255 levels.

* What a caller sends (job input, ``context_data``, loaded messages, an
  inline agent spec) is checked with :func:`check` and refused with an
  :class:`~orchestrator.errors.InvalidRequestError` naming the field: the
  caller can fix it.
* What a model or a tool produces is made storable with :func:`storable`:
  nobody can fix it, and a step must not fail on it. Each NUL and lone
  surrogate becomes U+FFFD (the replacement character, so the model still
  sees that something was there rather than two words silently joined);
  NaN and the infinities become the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"``; anything nested deeper than :data:`MAX_DEPTH` is
  replaced by a note saying so; the value of a credential this process
  holds becomes ``***`` (:func:`orchestrator.logs.redact_credentials`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel

from orchestrator.errors import InvalidRequestError
from orchestrator.logs import redact_credentials

#: Deepest nesting of lists and objects accepted in a stored value.
MAX_DEPTH = 64
#: Largest integer magnitude accepted (in bits): beyond, JSON round trips break.
MAX_INT_BITS = 1024

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"
TOO_DEEP = f"[nested deeper than {MAX_DEPTH} levels]"


def _text_problem(text: str) -> str | None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
    return f"contains {what} at index {found.start()}"


def _number_problem(value: float | int) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a JSON number"
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        return f"integer larger than 2**{MAX_INT_BITS}"
    return None


def _leaf_problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _number_problem(value)
    return _text_problem(value) if isinstance(value, str) else None


def _items(value: Any) -> list[tuple[Any, Any]] | None:
    """(key, item) pairs of a container (a pydantic model as its fields); None otherwise."""
    if isinstance(value, BaseModel):
        value = dict(value)
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, list | tuple):
        return list(enumerate(value))
    return None


def _key_problem(key: Any) -> str | None:
    if not isinstance(key, str):
        return f"key {key!r} is not a string"
    found = _text_problem(key)
    return f"key {found}" if found else None


def problem(value: Any, depth: int = 0) -> tuple[str, str] | None:
    """(path, what is wrong) of the first part of ``value`` that cannot be
    stored as JSON; None if all of it can. Pydantic models are walked as
    their fields."""
    if value is None or isinstance(value, bool | int | float | str):
        found = _leaf_problem(value)
        return ("", found) if found else None
    items = _items(value)
    if items is None:
        return "", f"{type(value).__name__} is not JSON"
    if depth > MAX_DEPTH:
        return "", f"nested deeper than {MAX_DEPTH} levels"
    keyed = isinstance(value, dict | BaseModel)
    for key, item in items:
        found = _key_problem(key) if keyed else None
        if found:
            return f".{key!r}", found
        inner = problem(item, depth + 1)
        if inner is not None:
            return f".{key}{inner[0]}", inner[1]
    return None


def check(value: Any, field: str) -> None:
    """Raise :class:`InvalidRequestError` naming ``field`` (and the path in
    it) if ``value`` cannot be stored."""
    found = problem(value)
    if found is not None:
        path, why = found
        if len(path) > 120:  # a deeply nested path: its two ends say enough
            path = f"{path[:60]}…{path[-60:]}"
        raise InvalidRequestError(f"{field}{path}: {why}", [field])


def too_deep(value: Any, depth: int = 0) -> bool:
    """True if lists and objects nest deeper than :data:`MAX_DEPTH` in ``value``."""
    items = _items(value)
    if items is None:
        return False
    return depth > MAX_DEPTH or any(too_deep(v, depth + 1) for _, v in items)


def storable_text(text: str) -> str:
    return redact_credentials(_UNSTORABLE.sub(REPLACEMENT, text))


def storable(value: Any, depth: int = 0) -> Any:
    """``value`` (JSON-like) made storable; see the module docstring."""
    if isinstance(value, dict | list | tuple) and depth > MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int) and not isinstance(value, bool) and _number_problem(value):
        return f"[an integer of {value.bit_length()} bits]"
    if isinstance(value, dict):
        return {storable_text(str(k)): storable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v, depth + 1) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return storable_text(str(value))
