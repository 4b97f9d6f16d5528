"""Every Redis key Chorus uses (Celery's own keys get the same prefix)."""

from __future__ import annotations


def events_stream(prefix: str, root_id: str) -> str:
    """The live event stream of one conversation tree."""
    return f"{prefix}:events:{root_id}"
