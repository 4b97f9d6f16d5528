"""``CHORUS_DB_POOL_SIZE`` and ``CHORUS_DB_POOL_OVERFLOW`` size each process's
Postgres pool: connections kept once opened, and more opened under a burst."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from orchestrator.runtime import Runtime
from orchestrator.settings import Settings


def test_the_pool_keeps_its_size_and_closes_the_overflow_on_return(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHORUS_DB_POOL_SIZE", "2")
    monkeypatch.setenv("CHORUS_DB_POOL_OVERFLOW", "1")
    sized = Settings(**settings.model_dump(exclude={"db_pool_size", "db_pool_overflow"}))
    assert (sized.db_pool_size, sized.db_pool_overflow) == (2, 1)
    rt = Runtime(sized)
    with ExitStack() as stack:
        sessions = [stack.enter_context(rt.session()) for _ in range(3)]
        for session in sessions:
            session.connection()  # each checks out its own connection
        pool = sessions[0].get_bind().pool
        assert pool.size() == 2
        assert pool.checkedout() == 3  # two kept and one overflow
    assert pool.checkedin() == 2  # the overflow connection was closed on return
