"""Real services for the tests: from the environment, else testcontainers.

``CHORUS_TEST_REDIS_URL`` and ``CHORUS_TEST_DATABASE_URL`` name a Redis and
a Postgres server (``.ci/run`` sets them to the local services). Each test
run makes its own database on that server and its own Redis key prefix,
and removes both at the end. Without them, a reachable Docker engine runs
throwaway containers; without either, the tests fail saying what to set.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import psycopg
import redis
from sqlalchemy.engine import make_url

HOW_TO = (
    "Integration tests need Redis and Postgres. Set CHORUS_TEST_REDIS_URL "
    "(e.g. redis://127.0.0.1:6379/0) and CHORUS_TEST_DATABASE_URL "
    "(e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres), "
    "or make a Docker engine reachable for testcontainers."
)


@dataclass(frozen=True)
class Services:
    redis_url: str
    database_url: str
    redis_prefix: str


def _docker_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@contextmanager
def _containers(stack: ExitStack) -> Iterator[tuple[str, str]]:
    from testcontainers.postgres import PostgresContainer
    from testcontainers.redis import RedisContainer

    pg = stack.enter_context(PostgresContainer("postgres:16-alpine", driver="psycopg"))
    rd = stack.enter_context(RedisContainer("redis:7-alpine"))
    host, port = rd.get_container_host_ip(), rd.get_exposed_port(6379)
    yield f"redis://{host}:{port}/0", pg.get_connection_url()


def _admin_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def _own_database(server_url: str) -> Iterator[str]:
    name = f"chorus_test_{uuid.uuid4().hex[:12]}"
    admin = _admin_dsn(server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        # FORCE ends the connections still open (pools of this process, workers).
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _drop_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


@contextmanager
def provide_services() -> Iterator[Services]:
    """Yield service URLs for one test run; fail clearly if there are none."""
    redis_url = os.environ.get("CHORUS_TEST_REDIS_URL")
    db_url = os.environ.get("CHORUS_TEST_DATABASE_URL")
    with ExitStack() as stack:
        if not (redis_url and db_url):
            if not _docker_available():
                raise RuntimeError(HOW_TO)
            redis_url, db_url = stack.enter_context(_containers(stack))
        prefix = f"chorus-test-{uuid.uuid4().hex[:8]}"
        database = stack.enter_context(_own_database(db_url))
        try:
            yield Services(redis_url, database, prefix)
        finally:
            _drop_prefix(redis_url, prefix)
