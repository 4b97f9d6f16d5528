"""Postgres state through SQLModel: tables, engine and sessions, migrations."""
