"""How the suite runs in parallel (pytest-xdist; pyproject's addopts say ``-n auto``).

* Workers: twice the cores, at most 8 (the tests mostly wait on worker
  processes). ``-n N`` or ``PYTEST_XDIST_AUTO_NUM_WORKERS`` sets another
  number; ``-n 0`` runs everything in the pytest process.
* Each xdist worker is a session of its own: its own database, Redis key
  prefix and fleet (tests/conftest.py).
* Order: tests marked ``long`` are handed out first, so the run does not
  end waiting on one of them.
* The tests of a module in :data:`SHARED_MODULES` run in one xdist worker,
  one after the other: they share a module-scoped fixture that starts worker
  processes or runs jobs, set up once. Every other test goes to whichever
  worker is free.

(xdist's own ``xdist_group`` mark does not group with pytest 9.2:
pytest-dev/pytest-xdist#1386.)
"""

from __future__ import annotations

import os

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

#: Modules whose tests share a module-scoped fixture that starts worker
#: processes (or runs a batch of jobs): each runs whole in one xdist worker.
SHARED_MODULES = frozenset(
    {
        "tests/dashboard/test_browser.py",  # browser: one Chromium
        "tests/dashboard/test_features.py",  # browser: one Chromium
        "tests/integration/test_event_streams.py",  # short_lived: a worker with short streams
        "tests/integration/test_mcp_toolsets.py",  # mcp_fleet: two workers with MCP servers
        "tests/integration/test_model_lease.py",  # short_lease: a fleet with a short lease
        "tests/integration/test_model_paths.py",  # proxy: one LiteLLM proxy process
        "tests/integration/test_parallelism.py",  # lanes: a worker of the lanes queue
        "tests/integration/test_step_queries.py",  # meter: an in-process worker, metered
        "tests/integration/test_tool_catalogs.py",  # replayed: every catalog case run once
        "tests/integration/test_tracing.py",  # traced: two workers exporting to a receiver
    }
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return min(8, 2 * (os.cpu_count() or 1))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


class SharedModuleScheduling(LoadScopeScheduling):
    """One work unit per test, but one per module of :data:`SHARED_MODULES`."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in SHARED_MODULES else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "load":  # another --dist was asked for
        return None
    return SharedModuleScheduling(config, log)
