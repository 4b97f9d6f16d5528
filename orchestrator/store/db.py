"""Engine and sessions for Postgres (psycopg 3) or the embedded SQLite file.

Pooled Postgres connections are not pinged before each use (``pool_pre_ping``
cost a round trip per transaction, a third of the hot path's). A connection
is recycled after ``RECYCLE_SECONDS`` and pinged only when it has sat idle
in the pool for longer than ``PING_AFTER_IDLE`` seconds (a client between
two calls, a worker after a quiet spell), where a server restart is the
likely thing to have happened meanwhile. A connection that dropped while in
use raises a disconnect: SQLAlchemy invalidates the pool's older
connections, and the task that met it is retried as a transient failure
(``engine/task_failures.py``, ``workers/tasks.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import event, exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection
from sqlmodel import Session, create_engine

from orchestrator.settings import Settings


def _cache_long_queries() -> None:
    """psycopg rewrites a query's ``%(name)s`` placeholders into ``$n`` in
    Python at every execution, and caches the rewrite only for queries of
    at most 4096 bytes and 50 parameters. Chorus's hot statements are built
    once and run with parameters, but a step that stores a batch of tools
    is one statement of about 9 KB and 176 parameters, whose rewrite cost
    half a millisecond of CPU per step. The cache (128 entries) then holds
    those too. The limits are psycopg's module constants: a psycopg
    without them is left as it is."""
    try:
        from psycopg import _queries
    except ImportError:  # a psycopg that moved it: its own limits stay
        return
    if hasattr(_queries, "MAX_CACHED_STATEMENT_LENGTH"):
        _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, 32_768)
    if hasattr(_queries, "MAX_CACHED_STATEMENT_PARAMS"):
        _queries.MAX_CACHED_STATEMENT_PARAMS = max(_queries.MAX_CACHED_STATEMENT_PARAMS, 512)


_cache_long_queries()

#: A pooled connection older than this is replaced before use.
RECYCLE_SECONDS = 1800
#: A connection idle in the pool longer than this is pinged before use.
PING_AFTER_IDLE = 5.0


class Pool(NamedTuple):
    """A process's Postgres connections: ``size`` are kept once opened (until
    recycled), ``overflow`` more are opened under a burst and closed again
    when returned. A new connection is a forked server process that loads
    its caches and plans every statement afresh: with 10 kept and 40 more
    closed on return, a busy fleet opened dozens of connections a second,
    and Postgres spent more CPU starting backends than answering queries."""

    size: int
    overflow: int


#: ``CHORUS_DB_POOL_SIZE`` and ``CHORUS_DB_POOL_OVERFLOW``'s defaults.
DEFAULT_POOL = Pool(
    Settings.model_fields["db_pool_size"].default,
    Settings.model_fields["db_pool_overflow"].default,
)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Transactions are begun by _sqlite_begin, not by the driver.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _checked_in(_dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
    record.info["idle_since"] = time.monotonic()


def _ping_if_idle(
    dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection
) -> None:
    """Ping a connection that sat idle a while; a dead one makes the pool
    connect afresh (``DisconnectionError`` is the pool's retry signal)."""
    idle_since = record.info.get("idle_since")
    if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE:
        return
    autocommit = dbapi_conn.autocommit
    try:
        dbapi_conn.autocommit = True
        cursor = dbapi_conn.cursor()
        cursor.execute("SELECT 1")
        cursor.close()
    except Exception as error:
        raise exc.DisconnectionError() from error
    finally:
        if not dbapi_conn.closed:
            dbapi_conn.autocommit = autocommit


def _sqlite_begin(conn: Any) -> None:
    """Take the write lock when a transaction begins. Several worker
    processes write the file: a deferred transaction that read first and
    then writes after another's commit gets SQLITE_BUSY at once, whatever
    the busy timeout; an immediate one waits its turn. A single autocommit
    statement (:func:`autocommit_engine`) is atomic on its own."""
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def get_engine(url: str, pool: Pool = DEFAULT_POOL) -> Engine:
    """One pooled engine per URL (and pool size) per process."""
    return _engine(url, pool)


def forget_engines() -> None:
    """Drop this process's engines (a forked child opens its own)."""
    _engine.cache_clear()
    _autocommit_engine.cache_clear()


@lru_cache(maxsize=8)
def _engine(url: str, pool: Pool) -> Engine:
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    # LIFO: the hot path keeps reusing the connections just returned, so
    # they are not idle long enough to be pinged; the others age out.
    engine = create_engine(
        url,
        pool_recycle=RECYCLE_SECONDS,
        pool_use_lifo=True,
        pool_size=pool.size,
        max_overflow=pool.overflow,
    )
    event.listen(engine.pool, "checkin", _checked_in)
    event.listen(engine.pool, "checkout", _ping_if_idle)
    return engine


def autocommit_engine(url: str, pool: Pool = DEFAULT_POOL) -> Engine:
    """The same pool, each statement committed on its own: for a single
    statement that is its own transaction (no ``BEGIN``/``COMMIT`` round trips)."""
    return _autocommit_engine(url, pool)


@lru_cache(maxsize=8)
def _autocommit_engine(url: str, pool: Pool) -> Engine:
    return _engine(url, pool).execution_options(isolation_level="AUTOCOMMIT")


#: Where a statement runs: a session, in its transaction, or a connection
#: whose every statement commits as it runs (:func:`autocommit_scope`).
Db = Session | Connection


def connection_of(db: Db) -> Connection:
    """The connection ``db`` runs its statements on (a session's, in its
    transaction)."""
    return db.connection() if isinstance(db, Session) else db


@contextmanager
def autocommit_scope(
    url: str, pool: Pool = DEFAULT_POOL, *, engine: Engine | None = None
) -> Iterator[Connection]:
    """A connection whose every statement commits as it runs: for reads and
    single-statement writes, without ``BEGIN``/``COMMIT`` round trips (and
    without a session's unit of work, which costs about 40 µs of CPU).
    ``engine``: one of the caller's instead of the process's for ``url``."""
    bind = (
        engine.execution_options(isolation_level="AUTOCOMMIT")
        if engine is not None
        else autocommit_engine(url, pool)
    )
    with bind.connect() as connection:
        yield connection


@contextmanager
def session_scope(
    url: str, *, pool: Pool = DEFAULT_POOL, engine: Engine | None = None
) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on error
    (``engine``: as for :func:`autocommit_scope`)."""
    bind = engine if engine is not None else get_engine(url, pool)
    with Session(bind, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
