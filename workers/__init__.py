"""The Celery side of Chorus: app factory, thin task entry points."""

from workers.app import create_app

__all__ = ["create_app"]
