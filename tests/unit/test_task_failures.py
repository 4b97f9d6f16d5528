"""Which task failures are worth a retry: lost connections, not bugs."""

from __future__ import annotations

import kombu.exceptions
import psycopg
import pytest
import redis
from sqlalchemy import create_engine
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import QueuePool

from orchestrator.engine.task_failures import describe, is_transient


def _wrapped(inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise RuntimeError("while saving") from exc
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    "exc",
    [
        OperationalError("SELECT 1", {}, psycopg.OperationalError("server closed the connection")),
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        kombu.exceptions.OperationalError("broker unreachable"),
        _wrapped(redis.ConnectionError("reset")),
    ],
)
def test_lost_connections_are_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("a bug in a transformer"),
        KeyError("spec"),
        DataError("INSERT", {}, psycopg.DataError("NUL character")),
        _wrapped(ValueError("bad stored spec")),
    ],
)
def test_everything_else_is_not(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_describe_names_the_exception_type() -> None:
    assert describe(RuntimeError("boom")) == "RuntimeError: boom"


def test_an_exhausted_connection_pool_is_transient() -> None:
    # Given a pool whose only connection is checked out (a busy process: more
    # worker threads than connections)
    engine = create_engine(
        "sqlite://", poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=0.05
    )
    # When another checkout waits past the pool's timeout
    with engine.connect(), pytest.raises(PoolTimeoutError) as raised:
        engine.connect()
    engine.dispose()
    # Then the task retries it (it waits for a connection) instead of failing the turn
    assert is_transient(raised.value)
