"""Running pre-built Core statements inside a session's transaction.

A statement built once at module level, with ``bindparam``s for what
varies, skips SQLAlchemy's per-call construction and cache-key generation;
run as Core on the session's connection it also skips the ORM's compile
state and entity loading. The hot paths of a step and of a subagent's
life (``chorus.advance``, a child's start and end) use these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from copy import copy
from functools import cache, partial
from typing import Any, cast

from pydantic_core import PydanticUndefined
from sqlalchemy import ColumnElement, CursorResult, Executable, Insert, Table, insert, literal
from sqlmodel import Session, SQLModel

from orchestrator.store.tables import CALL_FINISHED


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


def unfinished(status: ColumnElement[str]) -> ColumnElement[bool]:
    """A tool call's ``status`` says it has no result yet. The finished
    statuses are plain parameters, not an expanding one (``not_in`` of a
    tuple): no rewriting of the statement's SQL per run."""
    return status.not_in([literal(value) for value in CALL_FINISHED])


def insert_new(session: Session, model: type[SQLModel], **values: Any) -> dict[str, Any]:
    """INSERT a new row of ``model`` now, with the table's one Core
    statement, instead of through the unit of work at the next flush (the
    row does not join the session). Every column is sent, as the unit of
    work sends it: ``values``, and each other field's default as the
    model's constructor fills it (an unset autoincrement key is left to the
    database). Returns the values sent; no entity is built."""
    found = table(model)
    row = dict(values)
    for name, default in _defaults(model):
        if name not in row:
            row[name] = default()
    for key in _primary_key(found):
        if row.get(key) is None:
            row.pop(key, None)
    run(session, _insert(found), row)
    return row


@cache
def _defaults(model: type[SQLModel]) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """Each field of ``model`` with what fills it when not given."""
    found = []
    for name, info in model.model_fields.items():
        if info.default_factory is not None:
            found.append((name, cast(Callable[[], Any], info.default_factory)))
        elif info.default is PydanticUndefined:  # unset: the column's NULL
            found.append((name, partial(copy, None)))
        else:
            found.append((name, partial(copy, info.default)))
    return tuple(found)


@cache
def _primary_key(found: Table) -> tuple[str, ...]:
    return tuple(column.key for column in found.primary_key)


@cache
def _insert(found: Table) -> Insert:
    return insert(found)
