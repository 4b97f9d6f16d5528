"""Regular expressions of JSON schemas, matched without freezing a process.

A schema's ``pattern`` and ``patternProperties`` come from a job (an inline
spec's ``output_schema``) or from a tool's declaration, and the strings
they are matched against come from a model. Python's ``re`` backtracks
while holding the GIL: ``^(a|a)+$`` against forty ``a``\\ s and a ``!``
stops every thread of the process (the lease heartbeat included) for as
long as it runs. jsonschema matches with ``re.search`` wherever a pattern
applies (``pattern``, ``patternProperties``, and through them
``additionalProperties`` and ``unevaluatedProperties``) and compiles with
``re.compile`` for ``format: regex``, so :func:`limited` points those
modules' ``re`` at :data:`ENGINE`: the ``regex`` package (the same syntax),
which releases the GIL while it matches and stops after a time limit.

A pattern must first pass Python's own parser and expand to at most
:data:`MAX_PATTERN_SIZE` items (the engine compiles counted repeats as
copies, holding the GIL); else it is ``re.error``, as a pattern ``re``
refuses. Every validation of a schema a caller supplied, or of values a
model sent, runs inside :func:`limited`: its matches share
:data:`PATTERN_SECONDS` of CPU; when they are spent the validation ends with
:class:`~orchestrator.errors.PatternTimeoutError`, which the caller turns
into an error result. A pattern that runs out of time is never taken as
"does not match": under ``not`` that would accept the value.
"""

from __future__ import annotations

import re
import re._parser
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import jsonschema._format
import jsonschema._keywords
import jsonschema._legacy_keywords
import jsonschema._utils
import regex

from orchestrator.errors import PatternTimeoutError

#: CPU seconds the pattern matches of one validation may take together.
PATTERN_SECONDS = 0.25
#: Items a pattern may expand to. The engine compiles a counted repeat
#: (``a{100}``, ``(?:x){100,}``) as that many copies, holding the GIL:
#: ``(?:(?:(?:a{100}){100}){100}){100}`` would take minutes.
MAX_PATTERN_SIZE = 100_000
_REPEATS = (re._parser.MAX_REPEAT, re._parser.MIN_REPEAT, re._parser.POSSESSIVE_REPEAT)

_spent: ContextVar[list[float] | None] = ContextVar("chorus_pattern_seconds", default=None)


@contextmanager
def limited() -> Iterator[None]:
    """Match jsonschema's patterns on :data:`ENGINE` and let the matches
    inside share :data:`PATTERN_SECONDS`."""
    _install()
    token = _spent.set([0.0])
    try:
        yield
    finally:
        _spent.reset(token)


def _parts(value: Any) -> Iterator[re._parser.SubPattern]:
    """The sub-patterns held in a parsed item's argument."""
    if isinstance(value, re._parser.SubPattern):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _parts(item)


def _size(pattern: re._parser.SubPattern) -> int:
    """Items ``pattern`` compiles to, each counted repeat's body as many
    times as its lower bound."""
    total = 0
    for op, arg in pattern:
        if op in _REPEATS:
            low, _high, body = arg
            total += max(low, 1) * _size(body)
        else:
            total += 1 + sum(_size(part) for part in _parts(arg))
    return total


@lru_cache(maxsize=1024)
def _admit(pattern: str) -> None:
    """Raise ``re.error`` for a pattern Python's parser refuses, nested too
    deeply, or expanding past :data:`MAX_PATTERN_SIZE`."""
    try:
        size = _size(re._parser.parse(pattern))
    except RecursionError:
        raise re.error("the pattern is nested too deeply") from None
    if size > MAX_PATTERN_SIZE:
        raise re.error(
            f"the pattern's counted repeats expand to {size} items; at most {MAX_PATTERN_SIZE}"
        )


def search(pattern: str, string: str, flags: int = 0) -> Any:
    """``re.search`` on the ``regex`` engine, within the validation's time.

    Raises :class:`PatternTimeoutError` when the time is spent and
    ``re.error`` for a pattern the engine cannot compile (as ``re`` would).
    """
    _admit(pattern)
    spent = _spent.get()
    left = PATTERN_SECONDS - (spent[0] if spent else 0.0)
    if left <= 0:
        raise PatternTimeoutError(pattern, PATTERN_SECONDS)
    began = time.thread_time()
    try:
        return regex.search(pattern, string, flags, timeout=left, concurrent=True)
    except TimeoutError:
        raise PatternTimeoutError(pattern, PATTERN_SECONDS) from None
    except (regex.error, RecursionError) as exc:
        raise re.error(str(exc)) from None
    finally:
        if spent is not None:
            spent[0] += time.thread_time() - began


def compile(pattern: str, flags: int = 0) -> Any:
    """``re.compile`` on the ``regex`` engine (``re.error`` when it cannot)."""
    _admit(pattern)
    try:
        return regex.compile(pattern, flags)
    except (regex.error, RecursionError) as exc:
        raise re.error(str(exc)) from None


class _Engine(types.ModuleType):
    """``re`` as jsonschema sees it: :func:`search` and :func:`compile` in
    place of ``re``'s."""

    search = staticmethod(search)
    compile = staticmethod(compile)

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


#: What jsonschema's keyword and format modules call ``re``.
ENGINE = _Engine("re")
_MODULES = (
    jsonschema._keywords,
    jsonschema._utils,
    jsonschema._legacy_keywords,
    jsonschema._format,
)


def _install() -> None:
    for module in _MODULES:
        found = getattr(module, "re", None)
        if found is ENGINE:
            continue
        if found is not re:  # a jsonschema that no longer calls re.search/re.compile
            raise ImportError(f"{module.__name__} does not match patterns through re")
        module.re = ENGINE
