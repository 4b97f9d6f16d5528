"""What the running workers register, stored in Postgres for clients.

A worker writes, when it starts, every agent (its spec's JSON, output
schema included), tool and MCP server it registered into
``chorus_registration`` (one upsert), then marks them as still registered
every quarter of ``CHORUS_REGISTRATION_TTL`` (:class:`Publisher`, a thread
of its main process; one UPDATE that touches only rows not marked lately).
Every worker locks the rows in key order, so workers starting or marking
together never deadlock.
A client that submits an agent by a name it did not declare itself reads
the rows (:func:`learn`) and validates against them: a client that only
submits and follows imports no tool module.

A row counts while it was marked within ``CHORUS_REGISTRATION_TTL`` of the
freshest row: a name no running worker registers any more (an agent
removed from the modules, the last worker that had it stopped) is unknown
to clients that long after the other workers went on without it
(``UnknownAgentError`` at submit, not a job that fails at its worker).
Times are the database's. While no worker runs at all, nothing expires: a
submit is accepted and waits for the fleet, as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Self

from sqlalchemy import func, literal, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from orchestrator import registry
from orchestrator.periodic import Periodic
from orchestrator.runtime import Runtime
from orchestrator.store.clock import db_now, shifted
from orchestrator.store.dialect import is_postgres
from orchestrator.store.tables import RegistrationRow, table
from schemas import AgentSpec

log = logging.getLogger(__name__)

AGENT, TOOL, TOOLSET = "agent", "tool", "toolset"
#: Seconds a client trusts what it read before reading again for a name it
#: does not know.
FRESH_FOR = 5.0

_ROWS = table(RegistrationRow)
_learnt_at = -FRESH_FOR


def _registered() -> list[dict[str, Any]]:
    """This process's registrations, as rows (their time left to the
    database), in key order: the order every worker locks them in."""
    rows: list[dict[str, Any]] = [
        *(
            {"kind": AGENT, "name": n, "spec": registry.get_agent(n).model_dump(mode="json")}
            for n in registry.agent_names()
        ),
        *({"kind": TOOL, "name": n, "spec": None} for n in registry.tool_names()),
        *({"kind": TOOLSET, "name": n, "spec": None} for n in registry.toolset_names()),
    ]
    return sorted(rows, key=lambda row: (row["kind"], row["name"]))


def publish(rt: Runtime) -> int:
    """Upsert this process's registrations, marked now; how many rows."""
    rows = _registered()
    if not rows:
        return 0
    with rt.session() as session:
        insert = pg_insert if is_postgres(session) else sqlite_insert
        statement = insert(_ROWS).values([{**row, "updated_at": db_now()} for row in rows])
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[_ROWS.c.kind, _ROWS.c.name],
                set_={"spec": statement.excluded.spec, "updated_at": statement.excluded.updated_at},
            )
        )
    return len(rows)


def refresh(rt: Runtime, every: float) -> int:
    """Mark this process's registrations as still registered, those not
    marked in the last ``every / 2`` seconds (another worker with the same
    modules did the rest); how many rows.

    The rows are locked in key order, skipping those another worker holds
    (it is marking them now): two workers that mark the same rows at once
    never wait on each other in opposite orders (a deadlock, which an
    ``UPDATE ... WHERE IN`` alone allows, since its scan order is the
    plan's)."""
    key = tuple_(_ROWS.c.kind, _ROWS.c.name)
    keys = [(row["kind"], row["name"]) for row in _registered()]
    if not keys:
        return 0
    stale = (
        select(_ROWS.c.kind, _ROWS.c.name)
        .where(key.in_(keys), _ROWS.c.updated_at < db_now(literal(-every / 2)))
        .order_by(_ROWS.c.kind, _ROWS.c.name)
        .with_for_update(skip_locked=True)
    )
    with rt.session() as session:
        result = session.execute(update(_ROWS).where(key.in_(stale)).values(updated_at=db_now()))
        return int(result.rowcount)  # type: ignore[attr-defined]


class Publisher(Periodic):
    """A worker's thread: :func:`publish` once (until it succeeds), then
    :func:`refresh` every quarter of ``CHORUS_REGISTRATION_TTL``."""

    def __init__(self, rt: Runtime) -> None:
        self.rt, self._published = rt, False
        super().__init__(
            "chorus-registrations",
            rt.settings.registration_ttl / 4,
            self._mark,
            "could not publish this worker's registrations",
        )

    def start(self) -> Self:
        """Publish first, in the caller's thread (before the worker takes
        tasks, as clients may look a name up at once), then start marking."""
        self.once()
        return super().start()

    def _mark(self) -> None:
        if self._published:
            refresh(self.rt, self.every)
            return
        count = publish(self.rt)
        self._published = True
        log.info("published %d registrations", count)


def learn(rt: Runtime) -> None:
    """Read what the running workers register into the registry (what no
    running worker registers any more left out)."""
    global _learnt_at
    agents: list[AgentSpec] = []
    names: dict[str, list[str]] = {TOOL: [], TOOLSET: []}
    newest = select(func.max(_ROWS.c.updated_at)).scalar_subquery()
    live = _ROWS.c.updated_at >= shifted(newest, literal(-rt.settings.registration_ttl))
    query = select(_ROWS.c.kind, _ROWS.c.name, _ROWS.c.spec).where(live)
    with rt.session() as session:
        for kind, name, spec in session.execute(query):
            if kind == AGENT:
                agents.append(AgentSpec.model_validate(spec))
            elif kind in names:
                names[kind].append(name)
    registry.set_published(agents, names[TOOL], names[TOOLSET])
    _learnt_at = time.monotonic()


def learn_if_needed(rt: Runtime, agent: str | AgentSpec) -> None:
    """Before resolving ``agent``: a name this process did not declare is
    looked up in the published rows, read again if they are older than
    :data:`FRESH_FOR` seconds or do not hold it."""
    if not isinstance(agent, str) or agent in registry.agent_names():
        return
    if not registry.knows_agent(agent) or time.monotonic() - _learnt_at > FRESH_FOR:
        learn(rt)
