"""Engine and sessions for Postgres (psycopg 3) or the embedded SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Transactions are begun by _sqlite_begin, not by the driver.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    """Take the write lock when a transaction begins. Several worker
    processes write the file: a deferred transaction that read first and
    then writes after another's commit gets SQLITE_BUSY at once, whatever
    the busy timeout; an immediate one waits its turn."""
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
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=40)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on error."""
    with Session(get_engine(url), expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
