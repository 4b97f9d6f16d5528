"""The Alembic migrations match the SQLModel tables, up and down."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command

from orchestrator.store.migrate import alembic_config, upgrade
from tests.services import Services


@pytest.mark.integration
def test_postgres_schema_matches_the_tables(services: Services) -> None:
    command.check(alembic_config(services.database_url))  # raises on any difference


def test_sqlite_upgrades_downgrades_and_upgrades_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chorus.db'}"
    upgrade(url)
    command.check(alembic_config(url))
    command.downgrade(alembic_config(url), "base")
    upgrade(url)
    command.check(alembic_config(url))
