"""The names a model sees: a provider-legal alias for every tool name.

A tool's registered name is its *qualified* name: ``<namespace>.<name>``
when it has a namespace (``weather.forecast``), else the bare name. It may
hold dots and pass 64 characters; providers accept only
``^[a-zA-Z0-9_-]{1,64}$``. So the model is offered each tool under an
alias, and everything Chorus stores (events, tool call rows, messages,
access checks) keeps the qualified name:

* :func:`alias` is pure and deterministic: a legal name is itself;
  otherwise ``.`` becomes ``__``, any other illegal character ``_``, and a
  result longer than 64 characters is cut and ends with ``_`` and 8 hex
  digits of the qualified name's SHA-256 (:func:`hashed`).
* :func:`check_unique` refuses a set of names two of which share an alias
  (``a.b`` and ``a__b``): ``Agent(...)`` calls it on its tools, subagent
  tools and ``final_answer``, so a static agent never meets a collision.
* :func:`aliases` maps the names offered in one step. When two of them
  still share an alias (an inline spec, tools known only at step time),
  each one whose alias is not its own name takes its :func:`hashed` alias
  instead, so every offered tool stays callable; a legal name is never
  renamed. The step maps the model's reply back with the same mapping and
  renders the history with it.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable

from orchestrator.errors import ConfigurationError
from schemas.specs import NAME_PATTERN

__all__ = ["ALIAS_PATTERN", "MAX_ALIAS", "alias", "aliases", "check_unique", "hashed"]

#: Tool names every provider accepts (OpenAI, Anthropic, Gemini).
ALIAS_PATTERN = re.compile(NAME_PATTERN)
MAX_ALIAS = 64
_ILLEGAL = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_CHARS = 8


def _legal(name: str) -> str:
    return _ILLEGAL.sub("_", name.replace(".", "__"))


def hashed(name: str) -> str:
    """``name`` made legal, cut to fit, ending with ``_<8 hex digits of its hash>``."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return f"{_legal(name)[: MAX_ALIAS - _HASH_CHARS - 1]}_{digest}"


def alias(name: str) -> str:
    """The provider-legal name the model sees for the tool ``name``."""
    if ALIAS_PATTERN.match(name):
        return name
    legal = _legal(name)
    return legal if len(legal) <= MAX_ALIAS else hashed(name)


def _collisions(names: Iterable[str]) -> dict[str, list[str]]:
    """Aliases shared by more than one distinct name, with those names."""
    by_alias: dict[str, list[str]] = defaultdict(list)
    for name in dict.fromkeys(names):
        by_alias[alias(name)].append(name)
    return {a: found for a, found in by_alias.items() if len(found) > 1}


def check_unique(names: Iterable[str], owner: str) -> None:
    """Raise :class:`ConfigurationError` if two of ``names`` share an alias;
    ``owner`` says whose tools they are (``"agent 'x'"``), or if one name is
    offered twice (a tool named like a built-in: ``final_answer``, …)."""
    names = list(names)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(
            f"{owner}: {twice} offered twice: a tool may not take the name of a built-in "
            "tool or be listed twice"
        )
    clashes = _collisions(names)
    if clashes:
        detail = "; ".join(f"{found} are all offered as {a!r}" for a, found in clashes.items())
        raise ConfigurationError(
            f"{owner}: tool names collide once made provider-legal: {detail}; "
            "rename one or put it in another namespace"
        )


def aliases(names: Iterable[str]) -> dict[str, str]:
    """Qualified name → alias for the tools offered together (see the module
    docstring for what happens when two share an alias)."""
    names = list(dict.fromkeys(names))
    out = {name: alias(name) for name in names}
    for found in _collisions(names).values():
        for name in found:
            if out[name] != name:
                out[name] = hashed(name)
    return out
