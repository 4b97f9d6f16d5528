"""What the workers registered, stored in Postgres for clients.

A worker writes, when it starts, every agent (its spec's JSON, output
schema included), tool and MCP server it registered into
``chorus_registration`` (one upsert). A client that submits an agent by a
name it did not declare itself reads those rows
(:func:`learn`) and validates against them: a client that only submits
and follows imports no tool module. Rows are upserted, never deleted: a
name one worker registered stays known; a job naming something no live
worker has still fails at its worker, as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from orchestrator import registry
from orchestrator.runtime import Runtime
from orchestrator.store.dialect import is_postgres
from orchestrator.store.tables import RegistrationRow, table, utcnow
from schemas import AgentSpec

log = logging.getLogger(__name__)

AGENT, TOOL, TOOLSET = "agent", "tool", "toolset"
#: Seconds a client trusts what it read before reading again for a name it
#: does not know.
FRESH_FOR = 5.0

_ROWS = table(RegistrationRow)
_learnt_at = -FRESH_FOR


def publish(rt: Runtime) -> int:
    """Upsert this process's registrations; how many rows."""
    now = utcnow()
    rows: list[dict[str, Any]] = [
        *(
            {"kind": AGENT, "name": n, "spec": registry.get_agent(n).model_dump(mode="json")}
            for n in registry.agent_names()
        ),
        *({"kind": TOOL, "name": n, "spec": None} for n in registry.tool_names()),
        *({"kind": TOOLSET, "name": n, "spec": None} for n in registry.toolset_names()),
    ]
    if not rows:
        return 0
    for row in rows:
        row["updated_at"] = now
    with rt.session() as session:
        insert = pg_insert if is_postgres(session) else sqlite_insert
        statement = insert(_ROWS).values(rows)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[_ROWS.c.kind, _ROWS.c.name],
                set_={"spec": statement.excluded.spec, "updated_at": statement.excluded.updated_at},
            )
        )
    return len(rows)


def publish_quietly(rt: Runtime) -> None:
    """:func:`publish`, logging a failure (a worker must start without it)."""
    try:
        count = publish(rt)
    except Exception:
        log.warning("could not publish this worker's registrations", exc_info=True)
    else:
        log.info("published %d registrations", count)


def learn(rt: Runtime) -> None:
    """Read what the workers published into the registry."""
    global _learnt_at
    agents: list[AgentSpec] = []
    names: dict[str, list[str]] = {TOOL: [], TOOLSET: []}
    with rt.session() as session:
        for kind, name, spec in session.execute(select(_ROWS.c.kind, _ROWS.c.name, _ROWS.c.spec)):
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
