"""Where Postgres and SQLite differ, each difference named once.

Chorus runs on Postgres (a fleet) and on an embedded SQLite file
(``chorus local``). Every statement only Postgres can run is chosen by
one of the questions below, so each branch says why it exists and a
reader finds them all from here (``grep`` a name for its uses):

- :func:`returns_joined_rows`: an ``UPDATE … FROM`` returns the joined
  tables' columns (the step's lease, a tool call's claim, a subagent's
  claim and answer read their turn and conversation in the same statement);
- :func:`writes_in_ctes`: data-modifying CTEs, so a guarded write, its
  events and the rows that ride on it are one statement
  (:meth:`orchestrator.events.Outbox.flush_if`, several new rows in one
  INSERT, a cursor's move that ends its turn, a step's reply and its
  usage, a step's batch of tools to run, the end of a step in
  ``chorus.advance``, a child's start, a tool's result);
- :func:`numbers_in_select`: events are stored by an ``INSERT … SELECT``
  that numbers them (SQLite: a multi-row ``VALUES``);
- :func:`binds_arrays`: a list is bound as one array (``= ANY(:ids)``;
  SQLite: an expanding ``IN``);
- :func:`has_snapshots`: the transaction snapshot bounds what a reader of
  events may see (``pg_current_snapshot``);
- :func:`write_scope`: where a guarded write and its events run, an
  autocommit connection where they are one statement (Postgres), a
  transaction where they are several (SQLite).

:func:`url_is_postgres` answers the same from a database URL, before any
connection (:func:`write_scope`). The engine asks none of these: it calls
the store's named operations, which do. Elsewhere in ``store/``: SQLite keeps
naive UTC datetimes (``tables.UTCDateTime``), begins every transaction
``IMMEDIATE`` (``db.py``) and migrates in batch mode (``migrations/env.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import make_url
from sqlalchemy.engine import Engine
from sqlmodel import Session

from orchestrator.store.db import DEFAULT_POOL, Db, Pool, autocommit_scope, session_scope

_POSTGRES = "postgresql"


def url_is_postgres(url: str) -> bool:
    """Is the database at ``url`` Postgres?"""
    return make_url(url).get_backend_name() == _POSTGRES


def is_postgres(db: Db | Engine) -> bool:
    """Does ``db`` (a session, a connection, an engine) reach Postgres?"""
    bind = db.get_bind() if isinstance(db, Session) else db
    return bind.dialect.name == _POSTGRES


def returns_joined_rows(db: Db | Engine) -> bool:
    """Can an ``UPDATE … FROM`` return the rows of the tables it joins?
    Postgres can; SQLite returns only the updated table's columns."""
    return is_postgres(db)


def writes_in_ctes(db: Db | Engine) -> bool:
    """Can one statement write to several tables (data-modifying CTEs)?
    Postgres can; on SQLite each write is a statement of its own."""
    return is_postgres(db)


def numbers_in_select(db: Db | Engine) -> bool:
    """Are events stored by an ``INSERT … SELECT`` that numbers them?"""
    return is_postgres(db)


def binds_arrays(db: Db | Engine) -> bool:
    """Can a list be bound as one array parameter (``= ANY(:ids)``)?"""
    return is_postgres(db)


def has_snapshots(db: Db | Engine) -> bool:
    """Does a transaction's snapshot bound what a reader of events sees?"""
    return is_postgres(db)


@contextmanager
def write_scope(url: str, pool: Pool = DEFAULT_POOL) -> Iterator[Db]:
    """Where a guarded write runs with its events (a tool's result, a
    child's start): on Postgres a connection whose every statement commits
    as it runs, as the write and its events are one statement
    (:func:`writes_in_ctes`: no ``BEGIN``/``COMMIT`` round trips); on
    SQLite a session whose transaction commits on leaving, as they are
    several."""
    if url_is_postgres(url):
        with autocommit_scope(url, pool) as connection:
            yield connection
    else:
        with session_scope(url, pool=pool) as session:
            yield session
