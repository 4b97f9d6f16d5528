"""Hot statements run on the driver's connection (``orchestrator.store.fast_executor``)
give what SQLAlchemy gives: the same rows and types, the same exceptions,
a dropped connection invalidated, and listeners that see every statement."""

from __future__ import annotations

import secrets
from typing import Any

import psycopg
import pytest
from sqlalchemy import Float, bindparam, delete, event, func, insert, select, type_coerce
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.types import TypeDecorator

from orchestrator import Client, Settings
from orchestrator.engine.task_failures import is_transient
from orchestrator.runtime import Runtime
from orchestrator.store.db import get_engine
from orchestrator.store.fast_executor import execute, runs_directly
from orchestrator.store.statements import run
from orchestrator.store.tables import Conversation, MessageRow, table, utcnow
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.integration

_CONVERSATION = table(Conversation)
_MESSAGE = table(MessageRow)


class Marked(TypeDecorator[float]):
    """A type whose result processing shows: NULL is -1, a number + 1000."""

    impl = Float
    cache_ok = True

    def process_result_value(self, value: float | None, dialect: Dialect) -> float:
        return -1.0 if value is None else value + 1000


#: JSON objects and lists, tz-aware and NULL times, floats and NULL floats,
#: two columns of one name (``id``), labelled expressions, a type whose
#: result processor changes every value (NULL too), and a parameter whose
#: SQL name is not its key (``b plus`` is escaped in the SQL).
_READ = (
    select(
        _CONVERSATION.c.id,
        _CONVERSATION.c.agent_spec,
        _CONVERSATION.c.progress_at,
        _CONVERSATION.c.lease_until,
        _CONVERSATION.c.cost_usd,
        _CONVERSATION.c.plan,
        _MESSAGE.c.id,
        _MESSAGE.c.content,
        _MESSAGE.c.cost_usd.label("message_cost"),
        _MESSAGE.c.created_at,
        (_MESSAGE.c.id + bindparam("b plus")).label("shifted"),
        type_coerce(_MESSAGE.c.cost_usd, Marked).label("marked"),
    )
    .join(_MESSAGE, _MESSAGE.c.conversation_id == _CONVERSATION.c.id)
    .where(_CONVERSATION.c.id == bindparam("conversation_id"))
    .order_by(_MESSAGE.c.id)
)
_BACKEND = select(func.pg_backend_pid())
_COUNT = select(func.count()).select_from(_MESSAGE).where(_MESSAGE.c.id == bindparam("id"))
_DELETE = delete(_MESSAGE).where(_MESSAGE.c.id == bindparam("id"))
#: A message row given its id: a second insert of one id breaks the key.
_INSERT_MESSAGE = insert(_MESSAGE).values(
    id=bindparam("id"),
    conversation_id=bindparam("conversation_id"),
    turn_id=bindparam("turn_id"),
    step=0,
    role="user",
    kind="input",
    content=bindparam("content", type_=_MESSAGE.c.content.type),
    created_at=bindparam("created_at", type_=_MESSAGE.c.created_at.type),
)


def _finished_conversation(client: Client) -> str:
    job = client.submit("echo-child", "say it back")
    job.result(timeout=60)
    return job.conversation_id


def _message(client: Client, conversation_id: str, taken: bool) -> dict[str, Any]:
    """A message row of the conversation whose id is its newest's (``taken``)
    or one the id sequence never gives (negative: the database is shared)."""
    with client.runtime.autocommit() as connection:
        rows = execute(connection, _READ, {"conversation_id": conversation_id, "b plus": 0})
        newest = rows.all()[-1][6]
    return {
        "id": newest if taken else -secrets.randbelow(1 << 30) - 1,
        "conversation_id": conversation_id,
        "turn_id": "t" * 32,
        "content": [{"type": "text", "text": "again"}],
        "created_at": utcnow(),
    }


def test_rows_read_directly_are_sqlalchemys_rows(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    conversation_id = _finished_conversation(client)
    params = {"conversation_id": conversation_id, "b plus": 10}
    with client.runtime.autocommit() as connection:
        assert runs_directly(connection, _READ)
        direct = execute(connection, _READ, params).all()
        through = connection.execute(_READ, params).all()
    assert len(direct) >= 2  # the user's message and the answer
    assert -1.0 in [row.marked for row in direct]  # the user's message has no cost
    for mine, theirs in zip(direct, through, strict=True):
        assert mine._fields == theirs._fields
        assert tuple(mine) == tuple(theirs)
        assert [type(v) for v in mine] == [type(v) for v in theirs]
        assert mine.progress_at.tzinfo is not None and mine.created_at.tzinfo is not None
        assert isinstance(mine.agent_spec, dict) and isinstance(mine.content, list)
        assert mine.shifted == theirs.shifted == theirs[6] + 10
        assert mine.message_cost == theirs.message_cost
        assert mine[:2] == tuple(theirs[:2])


def test_a_broken_key_is_sqlalchemys_integrity_error(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    row = _message(client, _finished_conversation(client), taken=True)
    with client.runtime.autocommit() as connection:
        assert runs_directly(connection, _INSERT_MESSAGE)
        with pytest.raises(IntegrityError) as raised:
            execute(connection, _INSERT_MESSAGE, row)
        assert isinstance(raised.value.orig, psycopg.errors.UniqueViolation)
        assert not is_transient(raised.value)
        # the connection is still good: each statement was its own transaction
        assert execute(connection, _BACKEND).scalar_one() > 0


def test_a_dropped_connection_is_invalidated_and_the_next_one_works(
    settings: Settings,
) -> None:
    rt = Runtime(settings)
    with rt.autocommit() as connection:
        pid = execute(connection, _BACKEND).scalar_one()
    with psycopg.connect(_libpq_url(settings), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with rt.autocommit() as connection:
        # the pool hands out its latest connection again: the one just killed
        assert connection.connection.driver_connection.info.backend_pid == pid  # type: ignore[union-attr]
        assert runs_directly(connection, _BACKEND)
        with pytest.raises(OperationalError) as raised:
            execute(connection, _BACKEND)
        assert connection.invalidated
    assert raised.value.connection_invalidated
    assert is_transient(raised.value)  # a task that meets it is retried
    with rt.autocommit() as connection:
        assert execute(connection, _BACKEND).scalar_one() not in (None, pid)


def test_listeners_on_the_engine_see_every_statement(settings: Settings) -> None:
    engine = get_engine(settings.db_url)
    seen: list[str] = []

    def statement(_conn: Connection, _cursor: Any, sql: str, *_: Any) -> None:
        seen.append(sql)

    event.listen(engine, "before_cursor_execute", statement)
    try:
        with Runtime(settings).autocommit() as connection:
            assert not runs_directly(connection, _BACKEND)  # SQLAlchemy runs it, for them
            assert execute(connection, _BACKEND).scalar_one() > 0
    finally:
        event.remove(engine, "before_cursor_execute", statement)
    assert seen == [str(_BACKEND.compile(dialect=engine.dialect))]
    with Runtime(settings).autocommit() as connection:
        assert runs_directly(connection, _BACKEND)


def _libpq_url(settings: Settings) -> str:
    return settings.db_url.replace("postgresql+psycopg://", "postgresql://", 1)


def test_in_a_session_statements_share_its_transaction(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    row = _message(client, _finished_conversation(client), taken=False)
    free = row["id"]
    rt = client.runtime
    with rt.session() as session:
        assert runs_directly(session.connection(), _INSERT_MESSAGE)
        run(session, _INSERT_MESSAGE, row)
        assert run(session, _COUNT, {"id": free}).scalar_one() == 1  # seen in the transaction
        session.rollback()
    with rt.session() as session:
        assert run(session, _COUNT, {"id": free}).scalar_one() == 0  # rolled back
        run(session, _INSERT_MESSAGE, row)
    with rt.autocommit() as connection:
        assert execute(connection, _COUNT, {"id": free}).scalar_one() == 1  # committed
        execute(connection, _DELETE, {"id": free})
