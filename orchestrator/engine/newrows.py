"""New rows of several tables, inserted in one round trip where the database allows.

A turn's start writes a few rows no one reads back (a conversation, a
turn, its input message). On Postgres they go in ONE statement, every
INSERT but the last as a data-modifying CTE (the statement is built once
per shape, with ``bindparam``s); SQLite has no DML
in a CTE, so there each row is its own pre-built INSERT, in order. Either
way every column is sent (its Python-side default, else None), as the
ORM's unit of work sends a new object's, so the stored rows are the same.
"""

from __future__ import annotations

from functools import cache, lru_cache
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
    shape, params = _parameters(full)
    run(session, _combined(shape), params)


#: Per row, its table and its columns, each with the name of its parameter.
_Shape = tuple[tuple[Table, tuple[tuple[str, str], ...]], ...]


def _parameters(rows: list[tuple[Table, dict[str, Any]]]) -> tuple[_Shape, dict[str, Any]]:
    """The statement's shape and its parameters. Equal plain values of
    columns of one SQL type share a parameter (the rows' ids, their times,
    the zeros and NULLs): psycopg caches its parsing of a query of at most
    50 parameters only, and the rows have more columns than that."""
    names: dict[Any, str] = {}
    params: dict[str, Any] = {}
    shape = []
    for found, values in rows:
        columns = []
        for key, value in values.items():
            same: Any = (type(found.c[key].type), type(value), value)
            try:
                hash(same)
            except TypeError:  # a JSON document: a parameter of its own
                same = len(params)
            name = names.get(same)
            if name is None:
                name = names[same] = f"p{len(params)}"
                params[name] = value
            columns.append((key, name))
        shape.append((found, tuple(columns)))
    return tuple(shape), params


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


@lru_cache(maxsize=64)
def _combined(shape: _Shape) -> Insert:
    """The one statement inserting a row of each table of ``shape``."""
    inserts = [
        insert(found).values(
            {key: bindparam(name, type_=found.c[key].type) for key, name in columns}
        )
        for found, columns in shape
    ]
    statement = inserts[-1]
    for index, earlier in enumerate(inserts[:-1]):
        statement = statement.add_cte(earlier.cte(f"new_row_{index}"))
    return statement
