"""Running pre-built Core statements inside a session's transaction.

A statement built once at module level, with ``bindparam``s for what
varies, skips SQLAlchemy's per-call construction and cache-key generation;
run as Core on the session's connection it also skips the ORM's compile
state and entity loading. The hot paths of a step and of a subagent's
life (``chorus.advance``, a child's start and end) use these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from copy import copy
from functools import cache, lru_cache, partial
from typing import Any, cast

from pydantic_core import PydanticUndefined
from sqlalchemy import (
    ColumnElement,
    Executable,
    Insert,
    Update,
    bindparam,
    insert,
    literal,
    select,
    union_all,
)
from sqlmodel import Session, SQLModel

from orchestrator.store.db import Db, connection_of
from orchestrator.store.dialect import writes_in_ctes
from orchestrator.store.fast_executor import Rows, execute
from orchestrator.store.tables import CALL_FINISHED, MessageRow, table

#: Further writes of a guarded flush (:meth:`orchestrator.events.Outbox.flush_if`): given the
#: condition "the guard changed a row", the statements that run, as
#: data-modifying CTEs, under it. Built once (a module-level or cached
#: function): it is part of the statement's cache key.
Riders = Callable[[ColumnElement[bool]], tuple[Insert | Update, ...]]


def run(db: Db, statement: Executable, params: Mapping[str, Any]) -> Rows:
    """Execute ``statement`` in ``db``'s transaction, or on its own in an
    autocommit connection (on the driver's connection:
    :func:`orchestrator.store.fast_executor.execute`).

    A session's pending changes are flushed first, as an ORM statement's
    autoflush would: the statements reach the database in the same order,
    so rows are locked in the same order, as with the ORM statement this
    replaces."""
    if isinstance(db, Session):
        db.flush()
    return execute(connection_of(db), statement, params)


def unfinished(status: ColumnElement[str]) -> ColumnElement[bool]:
    """A tool call's ``status`` says it has no result yet. The finished
    statuses are plain parameters, not an expanding one (``not_in`` of a
    tuple): no rewriting of the statement's SQL per run."""
    return status.not_in([literal(value) for value in CALL_FINISHED])


#: A new row to insert: its model, and the values given (the others: defaults).
NewRow = tuple[type[SQLModel], dict[str, Any]]


def insert_new(session: Session, *rows: NewRow) -> None:
    """INSERT new ``rows`` now, with statements built once, instead of
    through the unit of work at the next flush (the rows do not join the
    session; no entity is built). Every column is sent, as the unit of work
    sends it: the values given, and each other field's default as the
    model's constructor fills it (an autoincrement key is left to the
    database). On Postgres the rows are one statement (all but the last as
    data-modifying CTEs: one round trip); on SQLite one statement each, in
    order. Raises the database's error (an ``IntegrityError`` on a unique
    key) as separate INSERTs would."""
    full = [filled(model, values) for model, values in rows]
    if len(rows) > 1 and writes_in_ctes(session):
        shape, params = _shared([model for model, _ in rows], full)
        run(session, _insert_all(shape), params)
        return
    for (model, _), row in zip(rows, full, strict=True):
        run(session, _insert(model), row)


@cache
def new_row_values(model: type[SQLModel], index: int = 0) -> dict[str, Any]:
    """The columns of a new row of ``model`` (all but an autoincrement key),
    as parameters for an INSERT inside another statement, whose own
    parameters may be named for columns: ``<table>_<key>``, or for the
    ``index``-th row of the model in the statement ``<table>_<index>_<key>``.
    :func:`new_row_params` fills them."""
    found = table(model)
    prefix = found.name if index == 0 else f"{found.name}_{index}"
    return {
        column.key: bindparam(f"{prefix}_{column.key}", type_=column.type)
        for column in found.c
        if column is not found.autoincrement_column
    }


def new_rows_if(model: type[SQLModel], condition: ColumnElement[bool], count: int = 1) -> Insert:
    """The INSERT of ``count`` rows of ``model`` from :func:`new_row_params`'
    values, only if ``condition``: a data-modifying CTE of a larger statement."""
    rows = [
        select(*(value.label(key) for key, value in new_row_values(model, i).items())).where(
            condition
        )
        for i in range(count)
    ]
    return insert(table(model)).from_select(
        list(new_row_values(model)), rows[0] if count == 1 else union_all(*rows)
    )


def new_row_params(rows: Iterable[NewRow]) -> dict[str, Any]:
    """The parameters of :func:`new_row_values` for ``rows`` (the rows of
    one model numbered in order): the values given and each other
    column's default (see :func:`insert_new`)."""
    params: dict[str, Any] = {}
    counts: dict[type[SQLModel], int] = {}
    for model, values in rows:
        index = counts[model] = counts.get(model, -1) + 1
        names = new_row_values(model, index)
        params.update({names[key].key: value for key, value in filled(model, values).items()})
    return params


#: A new message's columns, as parameters (all but its id):
#: :func:`message_params` fills them.
MESSAGE_VALUES = new_row_values(MessageRow)


def message_params(values: dict[str, Any]) -> dict[str, Any]:
    """The parameters of :data:`MESSAGE_VALUES`: ``values`` and the defaults."""
    return new_row_params([(MessageRow, values)])


#: Per row, its model and its columns, each with the name of its parameter.
_Shape = tuple[tuple[type[SQLModel], tuple[tuple[str, str], ...]], ...]


def _shared(
    models: list[type[SQLModel]], rows: list[dict[str, Any]]
) -> tuple[_Shape, dict[str, Any]]:
    """The statement's shape and its parameters. Equal plain values of
    columns of one SQL type share a parameter (the rows' ids, their times,
    the zeros and NULLs): psycopg caches its parsing of a query of at most
    50 parameters only, and three rows have more columns than that."""
    names: dict[Any, str] = {}
    params: dict[str, Any] = {}
    shape = []
    for model, row in zip(models, rows, strict=True):
        found = table(model)
        columns = []
        for key, value in row.items():
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
        shape.append((model, tuple(columns)))
    return tuple(shape), params


def filled(model: type[SQLModel], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` and the defaults of every other column of ``model``'s."""
    row = dict(values)
    for name, default in _defaults(model):
        if name not in row:
            row[name] = default()
    return row


@cache
def _defaults(model: type[SQLModel]) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """Each field of ``model`` with what fills it when not given."""
    found = []
    automatic = table(model).autoincrement_column
    for name, info in model.model_fields.items():
        if automatic is not None and name == automatic.key:
            continue  # the database's
        if info.default_factory is not None:
            found.append((name, cast(Callable[[], Any], info.default_factory)))
        elif info.default is PydanticUndefined:  # unset: the column's NULL
            found.append((name, partial(copy, None)))
        else:
            found.append((name, partial(copy, info.default)))
    return tuple(found)


@cache
def _insert(model: type[SQLModel]) -> Insert:
    """The INSERT of one row of ``model``: a parameter per column (named
    by its key), but the autoincrement key's."""
    found = table(model)
    return insert(found).values(
        {
            column.key: bindparam(column.key, type_=column.type)
            for column in found.c
            if column is not found.autoincrement_column
        }
    )


@lru_cache(maxsize=64)
def _insert_all(shape: _Shape) -> Insert:
    """The INSERT of one row of each model of ``shape`` in one statement
    (Postgres): the last row's, with the others' as CTEs."""
    inserts = []
    for model, columns in shape:
        found = table(model)
        inserts.append(
            insert(found).values(
                {key: bindparam(name, type_=found.c[key].type) for key, name in columns}
            )
        )
    *first, last = inserts
    return last.add_cte(*(statement.cte(f"r{i}") for i, statement in enumerate(first)))
