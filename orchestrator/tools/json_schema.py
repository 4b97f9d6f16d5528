"""Tools declared from a JSON schema: a name, a description, the JSON schema
of the parameters and a Python callable.

The schema reaches the model exactly as declared (descriptions, ``format``,
bounds, enums, nested objects, ``additionalProperties``: nothing added or
dropped). The arguments the model sends are validated against it with
``jsonschema`` (the draft the schema's ``$schema`` names, else 2020-12,
checking the ``format``\\ s jsonschema knows) and passed on as sent: an
optional parameter the model left out is absent, never ``null``, and a
schema ``default`` is not filled in. A violation is an error tool result
naming each JSON path (``$.passengers[0].birth_date: 'soon' is not a
'date'``).

:func:`schema_tool` declares one tool, :func:`tool_catalog` a whole
catalog of OpenAI-style function definitions in one namespace.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

from orchestrator import registry
from orchestrator.errors import ConfigurationError, InvalidRequestError, PatternTimeoutError
from orchestrator.patterns import limited
from orchestrator.tools.calls import Tool
from orchestrator.tools.decorator import context_params, qualified, tool_spec

__all__ = ["Arguments", "schema_tool", "tool_catalog"]

#: How the callable receives the validated arguments: as keyword arguments,
#: or as one dict (its first parameter).
Arguments = Literal["kwargs", "dict"]

#: Violations listed in one error result.
MAX_PROBLEMS = 10

_DEFINITION_KEYS = frozenset({"name", "description", "parameters"})


def parameters_validator(name: str, schema: Any) -> Validator:
    """The validator of ``schema``, checked: an object schema, JSON, valid
    for its draft. Anything else raises :class:`ConfigurationError` naming
    the tool."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ConfigurationError(
            f"tool {name!r}: parameters must be a JSON schema of type 'object'"
        )
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"tool {name!r}: parameters are not JSON: {exc}") from None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        with limited():  # its patterns compiled by the engine that will match them
            cls.check_schema(schema)
    except SchemaError as exc:
        raise ConfigurationError(
            f"tool {name!r}: invalid JSON schema of its parameters at {exc.json_path}: "
            f"{exc.message}"
        ) from None
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_arguments(validator: Validator, params: dict[str, Any], tool: str) -> None:
    """Raise :class:`InvalidRequestError` naming the JSON path of every
    violation (at most :data:`MAX_PROBLEMS`; ``fields`` holds the paths).
    Its patterns are matched within :data:`~orchestrator.patterns.PATTERN_SECONDS`."""
    try:
        with limited():
            found = list(validator.iter_errors(params))
    except PatternTimeoutError as exc:
        raise InvalidRequestError(
            f"invalid arguments for tool {tool!r}: {exc}", exc.fields
        ) from None
    errors = sorted(found, key=lambda e: [str(p) for p in e.path])
    if not errors:
        return
    shown = errors[:MAX_PROBLEMS]
    detail = "; ".join(f"{e.json_path}: {e.message}" for e in shown)
    more = f"; and {len(errors) - len(shown)} more" if len(errors) > len(shown) else ""
    raise InvalidRequestError(
        f"invalid arguments for tool {tool!r}: {detail}{more}",
        list(dict.fromkeys(e.json_path for e in shown)),
    )


def _first_param(fn: Callable[..., Any], name: str, skip: str | None) -> str:
    for param in inspect.signature(fn).parameters.values():
        if param.name != skip and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            return param.name
    raise ConfigurationError(
        f"tool {name!r}: arguments='dict' needs a function with a parameter for the dict"
    )


def schema_tool(
    name: str,
    description: str,
    parameters: dict[str, Any],
    fn: Callable[..., Any],
    *,
    namespace: str | None = None,
    arguments: Arguments = "kwargs",
    parallelizable: bool = True,
    queue: str = "tools",
    timeout: float = 300.0,
    approval: bool = False,
    approval_timeout: float | None = None,
) -> Tool:
    """Declare and register a tool from the JSON schema of its parameters.

    Args:
        name: the tool's name; with ``namespace`` it is registered as
            ``<namespace>.<name>``. The model sees a provider-legal alias
            (:mod:`orchestrator.tools.names`).
        description: what the model is told.
        parameters: the JSON schema (``"type": "object"``) of the arguments,
            offered to the model exactly as given.
        fn: called with the validated arguments as sent: as keyword
            arguments (``arguments="kwargs"``, the default; take ``**kwargs``
            for names that are not Python identifiers), or as one dict in
            its first parameter (``arguments="dict"``). A parameter
            annotated :class:`~orchestrator.ToolContext` receives the call's
            context. It may be async.
        parallelizable, queue, timeout, approval, approval_timeout: as for
            :func:`~orchestrator.tool`.

    Raises:
        ConfigurationError: the name, namespace or schema is invalid, or
            another tool is registered under the same qualified name.
    """
    full = qualified(name, namespace)
    if arguments not in ("kwargs", "dict"):
        raise ConfigurationError(f"tool {full!r}: arguments must be 'kwargs' or 'dict'")
    parameters = copy.deepcopy(parameters)  # later changes to the caller's dict change nothing
    validator = parameters_validator(full, parameters)
    spec = tool_spec(
        name,
        namespace,
        description=description,
        parameters=parameters,
        parallelizable=parallelizable,
        queue=queue,
        timeout=timeout,
        approval=approval,
        approval_timeout=approval_timeout,
    )
    context_param = next(iter(context_params(fn)), None)
    whole = _first_param(fn, full, context_param) if arguments == "dict" else None

    def validated(params: dict[str, Any]) -> dict[str, Any]:
        check_arguments(validator, params, spec.name)
        return {whole: params} if whole is not None else dict(params)

    t = Tool(spec=spec, fn=fn, arguments=validated, context_param=context_param)
    registry.register_tool(t)
    return t


def _definition(entry: Mapping[str, Any], namespace: str | None) -> Mapping[str, Any]:
    """``{"name", "description", "parameters"}``, unwrapped from
    ``{"type": "function", "function": {...}}`` when it comes that way."""
    if entry.get("type") == "function" and isinstance(entry.get("function"), Mapping):
        entry = entry["function"]
    name = entry.get("name")
    if not isinstance(name, str):
        raise ConfigurationError(f"catalog {namespace!r}: a definition has no name: {entry!r}")
    unknown = set(entry) - _DEFINITION_KEYS
    if unknown:
        raise ConfigurationError(
            f"tool {qualified(name, namespace)!r}: unknown keys {sorted(unknown)} in its "
            f"definition (expected {sorted(_DEFINITION_KEYS)})"
        )
    return entry


def tool_catalog(
    namespace: str | None,
    definitions: Iterable[Mapping[str, Any]],
    handlers: Mapping[str, Callable[..., Any]],
    *,
    arguments: Arguments = "kwargs",
    parallelizable: bool | Iterable[str] = True,
    queue: str = "tools",
    timeout: float = 300.0,
) -> list[Tool]:
    """Declare a catalog of tools in one namespace from OpenAI-style function
    definitions (``{"name", "description", "parameters"}``, bare or wrapped
    in ``{"type": "function", "function": ...}``), each served by the
    handler of the same name. Returns the tools in definition order.

    ``parallelizable`` is a bool for all of them, or the names of those
    that are (the others are barriers). Every definition needs a handler
    and every handler a definition (:class:`ConfigurationError` otherwise);
    the other options are as for :func:`schema_tool`.
    """
    entries = [_definition(entry, namespace) for entry in definitions]
    names = [entry["name"] for entry in entries]
    missing = [n for n in names if n not in handlers]
    extra = sorted(set(handlers) - set(names))
    if missing or extra or len(set(names)) != len(names):
        raise ConfigurationError(
            f"catalog {namespace!r}: definitions without a handler {missing}, handlers "
            f"without a definition {extra}, names defined twice "
            f"{sorted({n for n in names if names.count(n) > 1})}"
        )
    parallel = (
        {n: parallelizable for n in names}
        if isinstance(parallelizable, bool)
        else {n: n in frozenset(parallelizable) for n in names}
    )
    return [
        schema_tool(
            entry["name"],
            entry.get("description", ""),
            entry.get("parameters", {"type": "object", "properties": {}}),
            handlers[entry["name"]],
            namespace=namespace,
            arguments=arguments,
            parallelizable=parallel[entry["name"]],
            queue=queue,
            timeout=timeout,
        )
        for entry in entries
    ]
