"""Typed Python function -> JSON schema for its parameters, and argument validation.

:func:`build_params` reads a tool function's signature once, at decoration
time, and returns a pydantic validator model plus a self-contained JSON object
schema for provider function calling. :func:`validate_params` checks the
arguments a model produced before the call and returns the keyword arguments
to call the function with. :func:`describe` gives the docstring summary.
"""

from __future__ import annotations

import copy
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, ValidationError, create_model
from pydantic.fields import FieldInfo

from orchestrator.errors import InvalidRequestError

__all__ = ["ParamsModel", "build_params", "describe", "validate_params"]

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|"
    r"Attributes|Warnings?|Todo|See Also):\s*$"
)
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\(.*\))?\s*:\s*(.*)$")
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not")


class _Cycle(Exception):
    """A ``$defs`` entry refers to itself: the schema cannot be inlined."""


class ParamsModel(BaseModel):
    """Base of every generated validator: unknown arguments are rejected."""

    model_config = ConfigDict(extra="forbid")
    #: Name of the function the model was built from, used in error messages.
    tool_name: ClassVar[str] = ""


def describe(fn: Callable[..., Any]) -> str:
    """Return the docstring summary of ``fn``: the text before its first section."""
    summary: list[str] = []
    for line in (inspect.getdoc(fn) or "").splitlines():
        if _SECTION.match(line.strip()):
            break
        summary.append(line)
    return "\n".join(summary).strip()


def _doc_args(fn: Callable[..., Any]) -> dict[str, str]:
    """Parse the Google-style ``Args:`` section of ``fn``'s docstring."""
    out: dict[str, str] = {}
    current: str | None = None
    indent: int | None = None
    in_args = False
    for raw in (inspect.getdoc(fn) or "").splitlines():
        line = raw.strip()
        level = len(raw) - len(raw.lstrip())
        if not in_args:
            in_args = level == 0 and line in ("Args:", "Arguments:", "Parameters:")
            continue
        if not line:
            continue
        if level == 0:  # the next section (or prose) ends Args:
            break
        indent = level if indent is None else indent
        match = _ARG_LINE.match(line) if level == indent else None
        if match:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif current is not None:  # continuation line
            out[current] = f"{out[current]} {line}".strip()
    return out


def _hints(fn: Callable[..., Any], name: str, params: list[inspect.Parameter]) -> dict[str, Any]:
    """Resolve the annotations of ``params`` only (others may be unresolvable)."""
    shim = types.SimpleNamespace(__annotations__={p.name: p.annotation for p in params})
    globalns = getattr(inspect.unwrap(fn), "__globals__", {})
    try:
        return typing.get_type_hints(shim, globalns=globalns, include_extras=True)
    except Exception as exc:
        raise TypeError(f"tool {name!r}: cannot resolve annotations: {exc}") from exc


def _has_description(annotation: Any) -> bool:
    """True when ``Annotated[..., Field(description=...)]`` already describes it."""
    return typing.get_origin(annotation) is typing.Annotated and any(
        isinstance(m, FieldInfo) and m.description for m in annotation.__metadata__
    )


def build_params(
    fn: Callable[..., Any], *, skip: set[str]
) -> tuple[type[BaseModel], dict[str, Any]]:
    """Return (validator model, JSON schema) for fn's parameters, leaving out ``skip``.

    Every parameter not in ``skip`` must be annotated and passable by keyword;
    ``*args``, ``**kwargs``, positional-only and unannotated parameters raise
    :class:`TypeError` naming the function and the parameter.
    """
    name = getattr(fn, "__name__", repr(fn))
    params: list[inspect.Parameter] = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"tool {name!r}: parameter {p.name!r} is {p.kind.description}; "
                "tool parameters must be passable by keyword (no *args, **kwargs or /)"
            )
        if p.annotation is p.empty:
            raise TypeError(f"tool {name!r}: parameter {p.name!r} needs a type annotation")
        params.append(p)
    hints = _hints(fn, name, params)
    docs = _doc_args(fn)
    fields: dict[str, Any] = {}
    for p in params:
        annotation = hints[p.name]
        description = None if _has_description(annotation) else docs.get(p.name)
        default = ... if p.default is p.empty else p.default
        # Names pydantic cannot use as fields ("_x", "json", "model_dump") go by alias.
        safe = p.name
        if p.name.startswith(("_", "model_")) or hasattr(ParamsModel, p.name):
            safe = f"param_{p.name.lstrip('_')}_{len(fields)}"
        extra: dict[str, Any] = {"description": description} if description else {}
        if safe != p.name:
            extra["alias"] = p.name
        fields[safe] = (annotation, Field(default, **extra))
    try:
        model = create_model(f"{name}_params", __base__=ParamsModel, **fields)
        schema = model.model_json_schema(by_alias=True)
    except PydanticUserError as exc:
        raise TypeError(f"tool {name!r}: unsupported parameter type: {exc}") from exc
    model.tool_name = name
    return model, _finish(schema)


def _finish(schema: dict[str, Any]) -> dict[str, Any]:
    """Strip titles and inline ``$defs`` unless a definition is recursive."""
    head: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    schema = _strip_titles(schema)
    defs = schema.pop("$defs", {})
    try:
        return {**head, **_inline(schema, defs, frozenset())}
    except _Cycle:  # a recursive model: keep the (self-contained) references
        return {**head, **schema, "$defs": defs}


def _walk(node: Any, fn: Callable[[Any], Any]) -> dict[str, Any]:
    """Apply ``fn`` to every sub-schema of ``node`` (not to data like defaults)."""
    out = dict(node)
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: fn(v) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [fn(v) for v in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = fn(value)
    return out


def _strip_titles(node: dict[str, Any]) -> dict[str, Any]:
    """Drop the ``title`` keyword pydantic puts on every schema."""
    out = _walk(node, _strip_titles)
    if isinstance(out.get("title"), str):
        del out["title"]
    return out


def _inline(node: dict[str, Any], defs: dict[str, Any], seen: frozenset[str]) -> Any:
    """Replace ``{"$ref": "#/$defs/X"}`` by a copy of X; raise _Cycle on cycles."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        key = ref.removeprefix("#/$defs/")
        if key in seen:
            raise _Cycle(key)
        target = _inline(copy.deepcopy(defs[key]), defs, seen | {key})
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **_walk(siblings, lambda n: _inline(n, defs, seen))}
    return _walk(node, lambda n: _inline(n, defs, seen))


def validate_params(
    model: type[BaseModel], params: dict[str, Any], *, tool: str | None = None
) -> dict[str, Any]:
    """Validate ``params``; return the keyword arguments to call the function with.

    Values come back validated and coerced (enums as members, nested models as
    model instances). Only the arguments given are returned, so the function's
    own defaults apply to the rest. On failure raise
    :class:`~orchestrator.errors.InvalidRequestError` naming every offending field.
    """
    tool = tool or getattr(model, "tool_name", "") or model.__name__
    try:
        instance = model.model_validate(params)
    except ValidationError as exc:
        problems: list[str] = []
        fields: list[str] = []
        for error in exc.errors(include_url=False):
            loc = ".".join(str(part) for part in error["loc"]) or "(arguments)"
            problems.append(f"{loc}: {error['msg']}")
            if error["loc"] and str(error["loc"][0]) not in fields:
                fields.append(str(error["loc"][0]))
        raise InvalidRequestError(
            f"invalid arguments for tool {tool!r}: {'; '.join(problems)}", fields
        ) from None
    return {
        (info.alias or key): getattr(instance, key)
        for key, info in type(instance).model_fields.items()
        if key in instance.model_fields_set
    }
