"""The database's clock in SQL (``orchestrator.store.clock``) on SQLite: its
text compares with the datetimes SQLAlchemy stores, and reads back as one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Column, Integer, MetaData, Table, bindparam, create_engine, insert, select

from orchestrator.store.clock import NOW, db_now, shifted
from orchestrator.store.tables import UTCDateTime

_ROWS = Table(
    "stamps",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("at", UTCDateTime()),
    Column("seconds", Integer),
)


def test_sqlite_times_compare_with_stored_ones_and_read_back() -> None:
    engine = create_engine("sqlite://")
    _ROWS.metadata.create_all(engine)
    now = datetime.now(UTC)
    with engine.begin() as connection:
        connection.execute(
            insert(_ROWS),
            [
                {"id": 1, "at": now - timedelta(seconds=30), "seconds": 10},
                {"id": 2, "at": now - timedelta(seconds=5), "seconds": 10},
                {"id": 3, "at": now + timedelta(seconds=30), "seconds": 10},
            ],
        )
        read = connection.execute(NOW).scalar_one()
        ahead = connection.execute(select(db_now(bindparam("s"))), {"s": 90.5}).scalar_one()
        older = select(_ROWS.c.id).where(_ROWS.c.at < db_now(bindparam("s")))
        past = select(_ROWS.c.id).where(shifted(_ROWS.c.at, _ROWS.c.seconds) <= db_now())
        assert [r for (r,) in connection.execute(older, {"s": -20.0})] == [1]
        assert [r for (r,) in connection.execute(older, {"s": 0})] == [1, 2]
        assert [r for (r,) in connection.execute(past)] == [1]
    assert read.tzinfo is not None and abs((read - now).total_seconds()) < 5
    assert abs((ahead - read).total_seconds() - 90.5) < 1
