"""New rows of several tables, inserted in one round trip where the database allows.

A turn's start writes a few rows no one reads back (a conversation, a
turn, its input message). On Postgres they go in ONE statement, every
INSERT but the last as a data-modifying CTE (the statement is built once
per tuple of tables, with a ``bindparam`` per column); SQLite has no DML
in a CTE, so there each row is its own pre-built INSERT, in order. Either
way every column is sent (its Python-side default, else None), as the
ORM's unit of work sends a new object's, so the stored rows are the same.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Insert, Table, bindparam, insert
from sqlmodel import Session

from orchestrator.engine.prebuilt import run
from orchestrator.store.db import returns_joined_rows


def insert_new(session: Session, *rows: tuple[Table, dict[str, Any]]) -> None:
    """INSERT each ``(table, values)`` row now, in order; a column missing
    from ``values`` takes its default (None without one). Raises the
    database's error (an ``IntegrityError`` on a unique key) as the
    separate INSERTs would."""
    full = [(found, _complete(found, values)) for found, values in rows]
    if not returns_joined_rows(session):  # SQLite: one INSERT per row
        for found, values in full:
            run(session, _single(found), values)
        return
    params = {
        f"r{index}_{key}": value
        for index, (_, values) in enumerate(full)
        for key, value in values.items()
    }
    run(session, _combined(tuple((found, tuple(values)) for found, values in full)), params)


def _complete(found: Table, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every other column of ``found`` at its default: the
    column's Python-side default, else None; an autoincrement key without
    a value is left to the database."""
    complete = dict(values)
    for column in found.c:
        if column.key in complete:
            continue
        if column.primary_key and column.autoincrement is not False and column.default is None:
            continue
        default: Any = column.default
        if default is None:
            complete[column.key] = None
        elif default.is_callable:
            complete[column.key] = default.arg(None)
        else:
            complete[column.key] = default.arg
    return complete


@cache
def _single(found: Table) -> Insert:
    return insert(found)


@cache
def _combined(shape: tuple[tuple[Table, tuple[str, ...]], ...]) -> Insert:
    """The one statement inserting a row of each table (with those columns),
    its parameters named ``r<index>_<column>``."""
    inserts = [
        insert(found).values(
            {key: bindparam(f"r{index}_{key}", type_=found.c[key].type) for key in keys}
        )
        for index, (found, keys) in enumerate(shape)
    ]
    statement = inserts[-1]
    for index, earlier in enumerate(inserts[:-1]):
        statement = statement.add_cte(earlier.cte(f"new_row_{index}"))
    return statement
