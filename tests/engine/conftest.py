"""Engine decisions on the in-process harness: no worker process, no broker.

``harness`` runs on the test services (Postgres and Redis, as the fleet
tests do) when they are given, so the store statements the fleet runs are
the ones these tests run; ``client`` is its client, so a test body reads as
a fleet test's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from orchestrator import Client
from orchestrator.testing import Harness
from tests.conftest import LOOPBACK_ENDPOINTS, TEST_MODULES
from tests.services import Services

#: The key the fleet's workers carry for OpenAI-protocol calls (tests/conftest.py
#: worker_env): the loopback model servers' calls need one.
OPENAI_API_KEY = "sk-test-not-a-secret"


@contextmanager
def services_harness(services: Services, **settings: Any) -> Iterator[Harness]:
    """The test agents (``tests.agents``), their scripts played by the real
    model client, on the test services' database and Redis, with
    ``settings``; the provider key the fleet's workers have (the loopback
    model servers ask for one)."""
    with (
        pytest.MonkeyPatch.context() as env,
        Harness(
            modules=[TEST_MODULES],
            redis_url=services.redis_url,
            database_url=services.database_url,
            model_endpoints=[LOOPBACK_ENDPOINTS],
            **settings,
        ) as h,
    ):
        env.setenv("OPENAI_API_KEY", OPENAI_API_KEY)
        yield h


@pytest.fixture(scope="module")
def harness(services: Services) -> Iterator[Harness]:
    """The shared harness (:func:`services_harness`) of a test module."""
    with services_harness(services, max_children=200, max_depth=3) as h:
        yield h


@pytest.fixture(scope="module")
def client(harness: Harness) -> Client:
    return harness.client
