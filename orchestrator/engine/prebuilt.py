"""Running pre-built Core statements inside a session's transaction.

A statement built once at module level, with ``bindparam``s for what
varies, skips SQLAlchemy's per-call construction and cache-key generation;
run as Core on the session's connection it also skips the ORM's compile
state and entity loading. The hot paths of a step and of a subagent's
life (``chorus.advance``, a child's start and end) use these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import CursorResult, Executable, Table
from sqlmodel import Session, SQLModel


def table(model: type[SQLModel]) -> Table:
    """The Core table of a SQLModel table class (SQLModel leaves
    ``__table__`` untyped)."""
    found = model.__table__  # type: ignore[attr-defined]
    assert isinstance(found, Table)
    return found


def run(session: Session, statement: Executable, params: Mapping[str, Any]) -> CursorResult[Any]:
    """Execute ``statement`` in ``session``'s transaction.

    The session's pending changes are flushed first, as an ORM statement's
    autoflush would: the statements reach the database in the same order,
    so rows are locked in the same order, as with the ORM statement this
    replaces."""
    session.flush()
    return session.connection().execute(statement, params)
