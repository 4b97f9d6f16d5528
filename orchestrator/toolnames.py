"""Old home of tool names and aliases: now :mod:`orchestrator.tools.names`.

Kept so that ``from orchestrator.toolnames import ...`` keeps working.
"""

from orchestrator.tools.names import ALIAS_PATTERN, MAX_ALIAS, alias, aliases, check_unique, hashed

__all__ = ["ALIAS_PATTERN", "MAX_ALIAS", "alias", "aliases", "check_unique", "hashed"]
