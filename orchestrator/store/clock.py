"""The database's clock, in SQL: leases, stall clocks and deadlines are
compared on one clock, never on two workers' wall clocks.

``db_now(offset)`` is the database's current time plus ``offset`` seconds
(a bound value or any SQL expression), ``shifted(column, offset)`` a stored
time plus ``offset`` seconds. On Postgres they are ``now()`` (the
transaction's start) and interval arithmetic; on SQLite (one machine, one
clock) ``strftime`` in the text format SQLAlchemy stores, so stored and
computed times compare as text.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from orchestrator.store.tables import UTCDateTime

#: SQLAlchemy's SQLite text of a datetime (microseconds: SQLite gives milliseconds).
_SQLITE_FORMAT = "'%Y-%m-%d %H:%M:%f000'"


class _Shifted(FunctionElement[datetime]):
    """``base + seconds``; ``base`` None is the database's current time."""

    type = UTCDateTime()
    inherit_cache = True
    name = "chorus_shifted"

    def __init__(self, base: ColumnElement[Any] | None, seconds: ColumnElement[Any]) -> None:
        super().__init__(*((base, seconds) if base is not None else (seconds,)))

    @property
    def _parts(self) -> tuple[ColumnElement[Any] | None, ColumnElement[Any]]:
        clauses = list(self.clauses)
        return (clauses[0], clauses[1]) if len(clauses) == 2 else (None, clauses[0])


@compiles(_Shifted)
def _postgres(element: _Shifted, compiler: SQLCompiler, **kw: Any) -> str:
    base, seconds = element._parts
    start = "now()" if base is None else compiler.process(base, **kw)
    offset = compiler.process(seconds, **kw)
    return f"({start} + make_interval(secs => CAST({offset} AS DOUBLE PRECISION)))"


@compiles(_Shifted, "sqlite")
def _sqlite(element: _Shifted, compiler: SQLCompiler, **kw: Any) -> str:
    base, seconds = element._parts
    start = "'now'" if base is None else compiler.process(base, **kw)
    offset = compiler.process(seconds, **kw)
    return f"strftime({_SQLITE_FORMAT}, {start}, ({offset}) || ' seconds')"


class _Now(FunctionElement[datetime]):
    """The database's current time."""

    type = UTCDateTime()
    inherit_cache = True
    name = "chorus_now"


@compiles(_Now)
def _postgres_now(element: _Now, compiler: SQLCompiler, **kw: Any) -> str:
    return "now()"


@compiles(_Now, "sqlite")
def _sqlite_now(element: _Now, compiler: SQLCompiler, **kw: Any) -> str:
    return f"strftime({_SQLITE_FORMAT}, 'now')"


def db_now(offset: ColumnElement[Any] | None = None) -> ColumnElement[datetime]:
    """The database's current time, plus ``offset`` seconds when given."""
    return _Now() if offset is None else _Shifted(None, offset)


def shifted(base: ColumnElement[Any], offset: ColumnElement[Any]) -> ColumnElement[datetime]:
    """A stored time plus ``offset`` seconds."""
    return _Shifted(base, offset)


#: ``SELECT`` the database's current time (the sweeper reads it once a sweep).
NOW = select(db_now())
