"""Lazy exports of a package (PEP 562): a name's module is imported on first use.

``import orchestrator`` then costs nothing beyond this module: ``from
orchestrator import Client`` imports the client (and what it needs), never
the MCP client or litellm, and ``chorus --help`` imports neither (see
``docs/architecture.md`` for the layers and ``bench/imports.py`` for the
figures). A package lists its exports as name → defining module, and
imports the same names under ``TYPE_CHECKING`` so type checkers and IDEs
see them; ``__getattr__`` is defined only outside type checking, so a
misspelt name is still an error to mypy.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, overload

Owner = TypeVar("Owner")
T = TypeVar("T")


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, resolving each
    name of ``exports`` (name → module) by importing its module once.

    A resolved name is stored on the package, so the next access is a plain
    attribute read. An unknown name raises :class:`AttributeError`, which
    lets ``from package import submodule`` import the submodule as usual.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__


class made_once(Generic[Owner, T]):
    """:func:`functools.cached_property` whose value is made once whichever
    of an object's threads asks first: ``cached_property`` lost its lock in
    Python 3.12, so two threads could each make one (two Redis readers, say,
    one of them never closed). Like it, the value is stored in the object's
    ``__dict__``, where an assignment may put another."""

    def __init__(self, make: Callable[[Owner], T]) -> None:
        self.make = make
        self.name = make.__name__
        self.__doc__ = make.__doc__
        self.lock = threading.RLock()

    def __set_name__(self, owner: type[Owner], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[Owner] | None = None) -> made_once[Owner, T]: ...

    @overload
    def __get__(self, obj: Owner, owner: type[Owner] | None = None) -> T: ...

    def __get__(
        self, obj: Owner | None, owner: type[Owner] | None = None
    ) -> T | made_once[Owner, T]:
        if obj is None:
            return self
        held: dict[str, Any] = obj.__dict__
        if self.name not in held:
            with self.lock:
                if self.name not in held:
                    held[self.name] = self.make(obj)
        value: T = held[self.name]
        return value
