"""Engine and sessions for Postgres (psycopg 3) or the embedded SQLite file.

Pooled Postgres connections are not pinged before each use (``pool_pre_ping``
cost a round trip per transaction, a third of the hot path's). A connection
is recycled after ``RECYCLE_SECONDS`` and pinged only when it has sat idle
in the pool for longer than ``PING_AFTER_IDLE`` seconds (a client between
two calls, a worker after a quiet spell), where a server restart is the
likely thing to have happened meanwhile. A connection that dropped while in
use raises a disconnect: SQLAlchemy invalidates the pool's older
connections, and the task that met it is retried as a transient failure
(``engine/failures.py``, ``workers/tasks.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection
from sqlmodel import Session, create_engine

#: A pooled connection older than this is replaced before use.
RECYCLE_SECONDS = 1800
#: A connection idle in the pool longer than this is pinged before use.
PING_AFTER_IDLE = 5.0


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


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    """One pooled engine per URL per process."""
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    # LIFO: the hot path keeps reusing the connections just returned, so
    # they are not idle long enough to be pinged; the others age out.
    engine = create_engine(
        url, pool_recycle=RECYCLE_SECONDS, pool_use_lifo=True, pool_size=10, max_overflow=40
    )
    event.listen(engine.pool, "checkin", _checked_in)
    event.listen(engine.pool, "checkout", _ping_if_idle)
    return engine


@lru_cache(maxsize=8)
def autocommit_engine(url: str) -> Engine:
    """The same pool, each statement committed on its own: for a single
    statement that is its own transaction (no ``BEGIN``/``COMMIT`` round trips)."""
    return get_engine(url).execution_options(isolation_level="AUTOCOMMIT")


def returns_joined_rows(session: Session) -> bool:
    """Can an ``UPDATE … FROM`` return the rows of the tables it joins?
    Postgres can; SQLite returns only the updated table's columns."""
    return session.get_bind().dialect.name == "postgresql"


@contextmanager
def session_scope(url: str, *, autocommit: bool = False) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on error;
    with ``autocommit``, every statement commits as it runs."""
    engine = autocommit_engine(url) if autocommit else get_engine(url)
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
