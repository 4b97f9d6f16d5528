"""Hot statements run on the driver's connection, compiled once.

SQLAlchemy runs a statement it has already compiled (and cached) at a cost
of about 60 µs of CPU on top of the driver's: an execution context, result
metadata built from the cursor's description, the parameters looked up
and processed, and event dispatch. A 4-tool step runs 13 statements, all
built once (at import, or by a bounded cache), so they run here instead
(:func:`execute`):

- each statement is compiled once per dialect (its SQL and the bind and
  result processors of its types, as SQLAlchemy would use them), in a
  bounded cache keyed by the statement object: a statement built for one
  run only goes to SQLAlchemy (``connection.execute``), which caches by
  the statement's structure;
- the parameters are the caller's over the statement's own fixed values
  (what :meth:`~sqlalchemy.sql.compiler.SQLCompiler.construct_params`
  gives; that method itself where a parameter's SQL name is not its key),
  through the same bind processors; the driver's cursor runs the SQL on
  the SQLAlchemy connection's own driver connection (its transaction, or
  its autocommit mode, untouched), and the rows come back through the same
  result processors, as named tuples: index and slice access as
  SQLAlchemy's rows, attribute access by the column's key (a key that is
  not a Python name, or repeated, is reached by position).

An error goes through the SQLAlchemy connection's own error handling, so
callers see what they saw before: SQLAlchemy's exception (``IntegrityError``,
``OperationalError``, ``StatementError`` for a bad parameter …) and, for a
dropped connection, the connection and the pool's older ones invalidated.

The statement runs through SQLAlchemy itself, as before, when it cannot run
as compiled (an expanding ``IN`` parameter), when the engine has execute,
cursor or error listeners (they are given SQLAlchemy's execution context),
when the connection has a schema translation, when SQLAlchemy's SQL
logging is on, on a dialect without named ``%(name)s`` parameters
(SQLite) or with an async driver (the AsyncClient's, awaited through
SQLAlchemy's greenlet bridge), and on a SQLAlchemy without the connection's error handling used
here.
"""

from __future__ import annotations

import logging
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import exc
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler

_Processor = Callable[[Any], Any]


class Rows:
    """A statement's rows, all fetched, and the count of rows it changed:
    the part of SQLAlchemy's result that the hot paths use."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: Sequence[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return list(self._rows)

    def first(self) -> Any | None:
        return self._rows[0] if self._rows else None

    def one(self) -> Any:
        if len(self._rows) != 1:
            raise (exc.NoResultFound if not self._rows else exc.MultipleResultsFound)(
                f"expected one row, got {len(self._rows)}"
            )
        return self._rows[0]

    def scalar(self) -> Any | None:
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalars(self) -> list[Any]:
        return [row[0] for row in self._rows]


class _Prepared:
    """A statement compiled for one dialect, with its parameters' bind
    processors; its row type and result processors once its first rows
    have shown the driver's column types."""

    __slots__ = ("binds", "columns", "compiled", "fixed", "results", "row_type", "sql")

    def __init__(
        self,
        compiled: SQLCompiler,
        binds: tuple[tuple[str, _Processor], ...],
        fixed: dict[str, Any] | None,
    ) -> None:
        self.compiled = compiled
        self.sql = compiled.string
        self.binds = binds
        self.fixed = fixed
        # (name, type) of each result column, in order
        self.columns = [(c.keyname, c.type) for c in compiled._result_columns or ()]
        self.row_type: Any = None
        self.results: tuple[_Processor | None, ...] | None = None

    def rows(self, description: Sequence[Any], dialect: Dialect, rows: list[Any]) -> list[Any]:
        """``rows`` as named tuples, through their columns' result processors
        (learnt from the first rows' ``description``: the driver's types)."""
        if self.row_type is None:
            self._learn(description, dialect)
        make = self.row_type._make
        results = self.results
        if results is None:
            return [make(row) for row in rows]
        return [
            make([v if p is None else p(v) for p, v in zip(results, row, strict=True)])
            for row in rows
        ]

    def _learn(self, description: Sequence[Any], dialect: Dialect) -> None:
        if len(self.columns) != len(description):
            raise exc.InvalidRequestError(
                f"{len(description)} columns returned, {len(self.columns)} expected: {self.sql}"
            )
        results = tuple(
            type_.dialect_impl(dialect).result_processor(dialect, found.type_code)
            for (_, type_), found in zip(self.columns, description, strict=True)
        )
        self.results = results if any(p is not None for p in results) else None
        self.row_type = namedtuple("Row", [name for name, _ in self.columns], rename=True)  # type: ignore[misc]


#: What is used here of SQLAlchemy's own: a connection's handling of a driver
#: error (its exception, a dropped connection invalidated) and a compiled
#: statement's result columns. A SQLAlchemy without them runs everything.
_USABLE = hasattr(Connection, "_handle_dbapi_exception") and hasattr(SQLCompiler, "_result_columns")
#: Statements kept prepared: more than the hot paths build (the builders'
#: own caches hold about 700), fewer than would hold much memory.
PREPARED = 1024


def execute(
    connection: Connection, statement: Executable, params: Mapping[str, Any] | None = None
) -> Rows:
    """Run ``statement`` (built once, with ``bindparam``s) with ``params`` on
    ``connection``: on its driver connection when it can (see the module's
    docstring), through SQLAlchemy otherwise; its rows, fetched."""
    dialect = connection.dialect
    prepared = _prepared_for(statement, dialect)
    if prepared is None or _observed(connection):
        return _through_sqlalchemy(connection, statement, params)
    if not connection.in_transaction():
        connection.begin()  # as SQLAlchemy's own execution would (autobegin)
    sql = prepared.sql
    try:
        fixed = prepared.fixed
        if fixed is None:
            values = prepared.compiled.construct_params(params or {})
        else:  # what construct_params gives (a missing parameter: the driver's error)
            values = {**fixed, **params} if params else dict(fixed)
        for name, process in prepared.binds:
            if name in values:
                values[name] = process(values[name])
        driver = connection.connection.driver_connection
        assert driver is not None
        cursor = driver.cursor()
    except BaseException as error:  # a bad parameter, or a connection already lost
        connection._handle_dbapi_exception(error, sql, params, None, None)
    try:
        cursor.execute(sql, values)
        description = cursor.description
        rows = cursor.fetchall() if description is not None else []
        rowcount = cursor.rowcount
    except BaseException as error:
        if isinstance(error, dialect.loaded_dbapi.Error) or not isinstance(error, Exception):
            # SQLAlchemy's exception; a dropped (or interrupted) connection invalidated
            connection._handle_dbapi_exception(error, sql, values, cursor, None)
        raise
    finally:
        cursor.close()
    return Rows(prepared.rows(description, dialect, rows) if rows else rows, rowcount)


def runs_directly(connection: Connection, statement: Executable) -> bool:
    """Would :func:`execute` run ``statement`` on ``connection``'s driver
    connection, rather than through SQLAlchemy?"""
    return _prepared_for(statement, connection.dialect) is not None and not _observed(connection)


@lru_cache(maxsize=PREPARED)
def _prepared_for(statement: Executable, dialect: Dialect) -> _Prepared | None:
    """``statement`` prepared for ``dialect`` (an engine's: its driver's
    SQL and processors), or None: SQLAlchemy runs it."""
    return _prepare(statement, dialect)


def _through_sqlalchemy(
    connection: Connection, statement: Executable, params: Mapping[str, Any] | None
) -> Rows:
    result = connection.execute(statement, params)
    rows = result.all() if result.returns_rows else []
    return Rows(rows, result.rowcount)


def _observed(connection: Connection) -> bool:
    """Does anything watch, or change, SQLAlchemy's execution of statements?"""
    dispatch = connection.dispatch
    return bool(
        dispatch.before_execute
        or dispatch.after_execute
        or dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
        or connection.dialect.dispatch.handle_error
        or connection.dialect.dispatch.do_execute
        or "schema_translate_map" in connection.get_execution_options()
        or connection.engine.logger.isEnabledFor(logging.INFO)
    )


def _prepare(statement: Executable, dialect: Dialect) -> _Prepared | None:
    """The statement compiled for ``dialect``, with the bind processors of
    its parameters; None if it must run through SQLAlchemy."""
    if not _USABLE or dialect.paramstyle != "pyformat" or dialect.is_async:
        return None  # an async driver's cursor (AsyncClient) is awaited by SQLAlchemy
    compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    if not isinstance(compiled, SQLCompiler) or (
        compiled.post_compile_params or compiled.literal_execute_params
    ):
        return None  # SQL rewritten per run: SQLAlchemy's to do
    binds = {}  # by name: a parameter may be bound in several places
    fixed: dict[str, Any] | None = {}  # the values of the parameters not given
    for bind, name in compiled.bind_names.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            binds[compiled.escaped_bind_names.get(name, name)] = process
        if fixed is None:
            continue
        anonymous = str(bind.key).startswith("%(")  # a literal's: no caller names it
        if bind.callable is not None or name in compiled.escaped_bind_names:
            fixed = None  # valued at each run, or named apart: construct_params
        elif name != bind.key and not (anonymous and not bind.required):
            fixed = None  # a caller's key that is not the SQL's name: construct_params
        elif not bind.required:
            fixed[name] = bind.value
    return _Prepared(compiled, tuple(binds.items()), fixed)
