"""Old home of the JSON-schema tools: now :mod:`orchestrator.tools.json_schema`.

Kept so that ``from orchestrator.schematools import ...`` keeps working;
new code imports from :mod:`orchestrator` or :mod:`orchestrator.tools`.
"""

from orchestrator.tools.json_schema import (
    Arguments,
    check_arguments,
    parameters_validator,
    schema_tool,
    tool_catalog,
)

__all__ = ["Arguments", "check_arguments", "parameters_validator", "schema_tool", "tool_catalog"]
