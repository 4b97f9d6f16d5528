"""Tool parameter schemas and argument validation (orchestrator.tools.signature)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from orchestrator.errors import InvalidRequestError, UserError
from orchestrator.tools.signature import build_params, describe, validate_params
from schemas.specs import ToolSpec


class Color(Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int = 0


class Options(TypedDict):
    depth: int
    label: str


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


class Opaque:
    """Not something pydantic can build a schema for."""


def add(a: int, b: int, c: int = 0) -> int:
    """Add numbers.

    Args:
        a: the first number
        b (int): the second
            number, on two lines
        c: an optional third

    Returns:
        The sum.
    """
    return a + b + c


def schema_of(fn: Any, skip: set[str] | None = None) -> dict[str, Any]:
    return build_params(fn, skip=skip or set())[1]


def refs_in(node: Any) -> list[str]:
    """Every ``$ref`` value anywhere in a schema."""
    text = json.dumps(node)
    return [part.split('"')[0] for part in text.split('"$ref": "')[1:]]


# --- schema ----------------------------------------------------------------


def test_scalar_types_map_to_json_types() -> None:
    # Given a function with one parameter per scalar type
    def fn(s: str, i: int, f: float, b: bool) -> None: ...

    # When its schema is built
    schema = schema_of(fn)

    # Then it is an object schema with the matching JSON types, all required
    assert schema["type"] == "object"
    assert {k: v["type"] for k, v in schema["properties"].items()} == {
        "s": "string",
        "i": "integer",
        "f": "number",
        "b": "boolean",
    }
    assert schema["required"] == ["s", "i", "f", "b"]
    assert schema["additionalProperties"] is False


def test_defaults_are_optional_and_recorded() -> None:
    # Given parameters with and without defaults
    # When the schema is built
    schema = schema_of(add)

    # Then only those without a default are required; the default is shown
    assert schema["required"] == ["a", "b"]
    assert schema["properties"]["c"]["default"] == 0


def test_optional_parameter_allows_null() -> None:
    # Given X | None parameters, with and without a default
    def fn(required_nullable: int | None, maybe: str | None = None) -> None: ...

    # When the schema is built
    schema = schema_of(fn)

    # Then both accept null, and only the one without a default is required
    for name, json_type in (("required_nullable", "integer"), ("maybe", "string")):
        assert schema["properties"][name]["anyOf"] == [{"type": json_type}, {"type": "null"}]
    assert schema["required"] == ["required_nullable"]
    assert schema["properties"]["maybe"]["default"] is None


def test_enum_and_literal_become_enums() -> None:
    # Given an Enum parameter and a Literal parameter
    def fn(color: Color, mode: Literal["fast", "slow"] = "fast") -> None: ...

    # When the schema is built
    props = schema_of(fn)["properties"]

    # Then both are string enums, inlined
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["mode"]["type"] == "string"


def test_list_and_dict() -> None:
    # Given list[X] and dict[str, X] parameters
    def fn(tags: list[str], counts: dict[str, int]) -> None: ...

    # When the schema is built
    props = schema_of(fn)["properties"]

    # Then they are arrays and objects with typed items / values
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}


def test_nested_model_and_typeddict_are_inlined_objects() -> None:
    # Given a nested pydantic model, a TypedDict and a list of models
    def fn(point: Point, options: Options, path: list[Point]) -> None: ...

    # When the schema is built
    schema = schema_of(fn)
    props = schema["properties"]

    # Then each is an inline object schema: no $ref, no $defs
    assert "$defs" not in schema
    assert refs_in(schema) == []
    assert props["point"]["type"] == "object"
    assert props["point"]["properties"]["x"] == {"type": "integer"}
    assert props["point"]["required"] == ["x"]
    assert props["options"]["type"] == "object"
    assert props["options"]["required"] == ["depth", "label"]
    assert props["path"]["items"]["properties"]["y"] == {"type": "integer", "default": 0}


def test_recursive_model_keeps_self_contained_defs() -> None:
    # Given a recursive model, which cannot be inlined
    def fn(tree: Tree) -> None: ...

    # When the schema is built
    schema = schema_of(fn)

    # Then every $ref points into the schema's own $defs
    assert refs_in(schema)
    for ref in refs_in(schema):
        assert ref.startswith("#/$defs/")
        assert ref.removeprefix("#/$defs/") in schema["$defs"]


def test_no_title_noise_but_a_property_named_title_survives() -> None:
    # Given a parameter literally named "title" and a nested model
    def fn(title: str, point: Point) -> None: ...

    # When the schema is built
    schema = schema_of(fn)

    # Then pydantic's "title" keywords are gone, the property is kept
    assert "title" not in schema
    assert schema["properties"]["title"] == {"type": "string"}
    assert "title" not in schema["properties"]["point"]
    assert "title" not in schema["properties"]["point"]["properties"]["x"]


def test_skip_leaves_out_the_context_parameter() -> None:
    # Given a tool whose context parameter is unannotated or unresolvable
    def untyped_ctx(ctx, a: int) -> None:  # type: ignore[no-untyped-def]
        ...

    def unresolvable_ctx(ctx: NotDefinedAnywhere, a: int) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    # When the schema is built skipping "ctx"
    for fn in (untyped_ctx, unresolvable_ctx):
        schema = schema_of(fn, skip={"ctx"})

        # Then ctx is absent and the rest is there
        assert list(schema["properties"]) == ["a"]
        assert schema["required"] == ["a"]


def test_schema_is_json_and_accepted_by_toolspec() -> None:
    # Given the schema of a tool
    schema = schema_of(add)

    # When it is serialized and put in a ToolSpec
    spec = ToolSpec(
        name="add", description=describe(add), parameters=json.loads(json.dumps(schema))
    )

    # Then it round-trips unchanged
    assert spec.parameters == schema


def test_function_without_parameters() -> None:
    # Given a function taking nothing
    def fn() -> None: ...

    # When the schema is built
    # Then it is an empty object schema
    assert schema_of(fn) == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


# --- descriptions ----------------------------------------------------------


def test_docstring_args_become_descriptions() -> None:
    # Given a Google-style docstring with a type in parentheses and a wrapped line
    # When the schema is built
    props = schema_of(add)["properties"]

    # Then each parameter carries its description
    assert props["a"]["description"] == "the first number"
    assert props["b"]["description"] == "the second number, on two lines"
    assert props["c"]["description"] == "an optional third"


def test_annotated_field_description_wins_over_docstring() -> None:
    # Given a parameter described both by Annotated[..., Field] and the docstring
    def fn(
        n: Annotated[int, Field(description="from the annotation")],
        m: Annotated[int, Field(ge=0)] = 1,
    ) -> None:
        """Fn.

        Args:
            n: from the docstring
            m: only the docstring
        """

    # When the schema is built
    props = schema_of(fn)["properties"]

    # Then the annotation's description is used, the docstring fills the gaps
    assert props["n"]["description"] == "from the annotation"
    assert props["m"]["description"] == "only the docstring"
    assert props["m"]["minimum"] == 0
    assert schema_of(fn)["required"] == ["n"]


def test_describe_returns_the_summary_before_sections() -> None:
    # Given documented and undocumented functions
    def bare(x: int) -> None: ...

    def prose_only(x: int) -> None:
        """Line one.

        Line two.
        """

    # When described
    # Then the text before Args:/Returns: is returned, or "" without a docstring
    assert describe(add) == "Add numbers."
    assert describe(prose_only) == "Line one.\n\nLine two."
    assert describe(bare) == ""


# --- validation ------------------------------------------------------------


def test_validation_coerces_to_python_values() -> None:
    # Given a tool with enum, nested model, TypedDict and collection parameters
    def fn(
        n: int,
        ratio: float,
        flag: bool,
        color: Color,
        point: Point,
        options: Options,
        counts: dict[str, int],
        maybe: int | None = None,
    ) -> None: ...

    model, _ = build_params(fn, skip=set())

    # When JSON-ish arguments are validated
    kwargs = validate_params(
        model,
        {
            "n": "3",
            "ratio": 1,
            "flag": "true",
            "color": "blue",
            "point": {"x": 1},
            "options": {"depth": "2", "label": "l"},
            "counts": {"k": "4"},
        },
    )

    # Then the values are coerced Python values, ready for fn(**kwargs)
    assert kwargs == {
        "n": 3,
        "ratio": 1.0,
        "flag": True,
        "color": Color.BLUE,
        "point": Point(x=1, y=0),
        "options": {"depth": 2, "label": "l"},
        "counts": {"k": 4},
    }
    assert isinstance(kwargs["color"], Color)
    assert isinstance(kwargs["point"], Point)
    fn(**kwargs)


def test_validation_returns_only_given_arguments_so_defaults_apply() -> None:
    # Given a tool with a default
    model, _ = build_params(add, skip=set())

    # When called without the defaulted argument
    kwargs = validate_params(model, {"a": 1, "b": 2})

    # Then it is left out and the function's own default applies
    assert kwargs == {"a": 1, "b": 2}
    assert add(**kwargs) == 3


def test_error_names_every_offending_field() -> None:
    # Given the add tool
    model, _ = build_params(add, skip=set())

    # When b has the wrong type and a is missing
    with pytest.raises(InvalidRequestError) as caught:
        validate_params(model, {"b": "abc", "c": 1})

    # Then the message and .fields name both
    message = str(caught.value)
    assert message.startswith("invalid arguments for tool 'add': ")
    assert "b: Input should be a valid integer" in message
    assert "a: Field required" in message
    assert sorted(caught.value.fields) == ["a", "b"]
    assert isinstance(caught.value, UserError)


def test_error_for_extra_argument() -> None:
    # Given the add tool
    model, _ = build_params(add, skip=set())

    # When an unknown argument is passed
    with pytest.raises(InvalidRequestError) as caught:
        validate_params(model, {"a": 1, "b": 2, "verbose": True})

    # Then it is rejected by name
    assert "verbose: Extra inputs are not permitted" in str(caught.value)
    assert caught.value.fields == ["verbose"]


def test_error_inside_nested_model_names_the_path() -> None:
    # Given a tool taking a model
    def move(point: Point) -> None: ...

    model, _ = build_params(move, skip=set())

    # When a nested field is wrong
    with pytest.raises(InvalidRequestError) as caught:
        validate_params(model, {"point": {"x": "left"}})

    # Then the message gives the path and .fields the parameter
    assert "point.x: Input should be a valid integer" in str(caught.value)
    assert caught.value.fields == ["point"]


def test_error_for_bad_enum_and_non_object_arguments() -> None:
    # Given a tool taking an enum
    def paint(color: Color) -> None: ...

    model, _ = build_params(paint, skip=set())

    # When the value is not a member, or the arguments are not an object
    with pytest.raises(InvalidRequestError) as bad_enum:
        validate_params(model, {"color": "green"})
    with pytest.raises(InvalidRequestError) as not_object:
        validate_params(model, ["red"])  # type: ignore[arg-type]

    # Then both are clear user errors
    assert "color: Input should be 'red' or 'blue'" in str(bad_enum.value)
    assert bad_enum.value.fields == ["color"]
    assert "invalid arguments for tool 'paint': (arguments):" in str(not_object.value)
    assert not_object.value.fields == []


def test_explicit_tool_name_overrides_function_name() -> None:
    # Given a model built from add
    model, _ = build_params(add, skip=set())

    # When validated with the registered tool name
    with pytest.raises(InvalidRequestError, match="invalid arguments for tool 'math_add'"):
        validate_params(model, {}, tool="math_add")


def test_parameter_names_reserved_by_pydantic_still_work() -> None:
    # Given parameters whose names clash with BaseModel attributes or are private
    def fn(json: str, schema: int, tool_name: str, model_id: str, _raw: bool = False) -> None: ...

    # When built and validated
    model, schema = build_params(fn, skip=set())
    kwargs = validate_params(
        model, {"json": "j", "schema": "2", "tool_name": "t", "model_id": "m", "_raw": True}
    )

    # Then the public names are used in both the schema and the kwargs
    assert list(schema["properties"]) == ["json", "schema", "tool_name", "model_id", "_raw"]
    assert schema["required"] == ["json", "schema", "tool_name", "model_id"]
    assert kwargs == {"json": "j", "schema": 2, "tool_name": "t", "model_id": "m", "_raw": True}
    fn(**kwargs)


# --- decoration-time errors ------------------------------------------------


def unannotated(a: int, b) -> None:  # type: ignore[no-untyped-def]
    ...


def star_args(a: int, *rest: int) -> None: ...


def star_kwargs(a: int, **rest: int) -> None: ...


def positional_only(a: int, /, b: int) -> None: ...


@pytest.mark.parametrize(
    ("fn", "param"),
    [(unannotated, "b"), (star_args, "rest"), (star_kwargs, "rest"), (positional_only, "a")],
)
def test_bad_signatures_raise_type_error_naming_function_and_parameter(fn: Any, param: str) -> None:
    # Given a signature that cannot be called with keyword arguments from JSON
    # When the schema is built
    with pytest.raises(TypeError) as caught:
        build_params(fn, skip=set())

    # Then the error names the function and the parameter
    assert f"tool {fn.__name__!r}" in str(caught.value)
    assert f"parameter {param!r}" in str(caught.value)


def test_unsupported_type_raises_type_error_naming_function() -> None:
    # Given a parameter of a type pydantic cannot describe
    def fn(thing: Opaque) -> None: ...

    # When the schema is built / Then a TypeError names the function
    with pytest.raises(TypeError, match="tool 'fn': unsupported parameter type"):
        build_params(fn, skip=set())


def test_unresolvable_annotation_raises_type_error() -> None:
    # Given an annotation naming something that does not exist
    def fn(thing: Missing) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    # When the schema is built / Then a TypeError names the function
    with pytest.raises(TypeError, match="tool 'fn': cannot resolve annotations"):
        build_params(fn, skip=set())
