"""A module-level app for tools that want ``-A``: ``celery -A workers.main flower``.

Settings are read from the environment when this module is imported.
"""

from workers.app import create_app

app = create_app()
