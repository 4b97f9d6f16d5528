"""Every name users import today keeps working, lazily resolved or at its old path."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import orchestrator
import orchestrator.tools

#: ``orchestrator.__all__`` before its exports became lazy (none may go),
#: by the module that defines them.
PUBLIC = {
    "orchestrator.agents": "Agent",
    "orchestrator.client": "Client Job",
    "orchestrator.errors": (
        "AgentRunError ChorusError ConfigurationError ConversationBusyError "
        "ConversationNotFound InvalidRequestError JobFailedError ModelBehaviorError ModelError "
        "PatternTimeoutError SecretInSettingsError ServiceUnavailableError "
        "SettingNotAllowedError ToolExecutionError ToolOutputNotFound UnknownAgentError "
        "UnknownToolError UserError"
    ),
    "orchestrator.settings": "Settings load_settings",
    "orchestrator.tools.calls": "Tool ToolContext",
    "orchestrator.tools.decorator": "tool",
    "orchestrator.tools.json_schema": "schema_tool tool_catalog",
    "orchestrator.tools.mcp_server": "MCPServerSpec",
    "orchestrator.tools.toolsets": "MCPServer",
}
NAMES = [(module, name) for module, names in PUBLIC.items() for name in names.split()]

#: Old module paths → names they exported → the module now defining each.
OLD_PATHS = {
    "orchestrator.tools": {
        "tool": "orchestrator.tools.decorator",
        "Tool": "orchestrator.tools.calls",
        "ToolContext": "orchestrator.tools.calls",
        "ToolStopped": "orchestrator.tools.calls",
        "STOP_POLL": "orchestrator.tools.calls",
        "run_with_timeout": "orchestrator.tools.calls",
        "context_params": "orchestrator.tools.decorator",
        "qualified": "orchestrator.tools.decorator",
        "tool_spec": "orchestrator.tools.decorator",
    },
    "orchestrator.schematools": {
        "schema_tool": "orchestrator.tools.json_schema",
        "tool_catalog": "orchestrator.tools.json_schema",
        "parameters_validator": "orchestrator.tools.json_schema",
        "check_arguments": "orchestrator.tools.json_schema",
    },
    "orchestrator.toolsets": {
        "MCPServer": "orchestrator.tools.toolsets",
        "MCPServerSpec": "orchestrator.tools.mcp_server",
        "offered": "orchestrator.tools.toolsets",
        "forget": "orchestrator.tools.toolsets",
        "remote_tool": "orchestrator.tools.remote",
    },
    "orchestrator.toolnames": {
        "alias": "orchestrator.tools.names",
        "aliases": "orchestrator.tools.names",
        "check_unique": "orchestrator.tools.names",
        "hashed": "orchestrator.tools.names",
        "ALIAS_PATTERN": "orchestrator.tools.names",
    },
}


@pytest.mark.parametrize(("module", "name"), NAMES)
def test_every_public_name_still_imports(module: str, name: str) -> None:
    assert name in orchestrator.__all__
    assert name in dir(orchestrator)
    assert getattr(orchestrator, name) is getattr(importlib.import_module(module), name)


def test_the_lazy_exports_are_the_names_listed() -> None:
    """Each lazy name resolves to its module's object, and none is named like
    a submodule (importing the submodule would set the name to the module)."""
    for package in (orchestrator, orchestrator.tools):
        exports = vars(package)["_EXPORTS"]
        assert sorted(exports) == sorted(package.__all__), package.__name__
        submodules = {m.name for m in pkgutil.iter_modules(package.__path__)}
        assert not submodules & set(exports), package.__name__
        for name, module in exports.items():
            assert getattr(package, name) is getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", list(OLD_PATHS))
def test_old_module_paths_still_import(path: str) -> None:
    module = importlib.import_module(path)
    for name, home in OLD_PATHS[path].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'orchestrator' has no attribute 'Clinet'"):
        orchestrator.Clinet  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError, match="Clinet"):
        exec("from orchestrator import Clinet")
