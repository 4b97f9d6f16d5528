"""Running pre-built Core statements inside a session's transaction.

A statement built once at module level, with ``bindparam``s for what
varies, skips SQLAlchemy's per-call construction and cache-key generation;
run as Core on the session's connection it also skips the ORM's compile
state and entity loading. The hot paths of a step and of a subagent's
life (``chorus.advance``, a child's start and end) use these.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from sqlalchemy import CursorResult, Executable, Insert, Table, insert
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


def insert_rows(session: Session, *rows: SQLModel) -> None:
    """INSERT new ``rows`` now, in order, each with its table's one Core
    statement, instead of through the unit of work at the next flush (the
    rows do not join the session). Every column is sent, as the unit of
    work sends it; an unset autoincrement key is left to the database."""
    for row in rows:
        found = table(type(row))
        values = {}
        for column in found.c:
            value = getattr(row, column.key)
            if value is not None or not column.primary_key:
                values[column.key] = value
        run(session, _insert(found), values)


@cache
def _insert(found: Table) -> Insert:
    return insert(found)
