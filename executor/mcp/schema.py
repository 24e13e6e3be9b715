"""A pydantic input model per MCP tool, whose validation is the tool's JSON Schema.

toolfence's schema gate validates arguments with the tool's pydantic model
(`admission.gate_schema`). An MCP tool declares a JSON Schema instead, and
translating JSON Schema into pydantic fields by hand would be a second, subtly
different validator. So the generated model has no fields: a wrap validator
runs the declared schema through `jsonschema` and keeps the validated dict, and
the serializer gives that dict back unchanged (`model_dump(mode="json")` is
exactly the arguments). Schema violations are raised as `PydanticCustomError`s
carrying only the location, the JSON Schema keyword that failed and what the
schema expected (taken from the schema, never from the rejected value), which
`admission.schema_details` turns into safe `ErrorDetail`s.

The declared draft's semantics are kept: `format` is an annotation in
2020-12, so it is not asserted (asserting it would refuse calls the server
accepts, and jsonschema checks some formats only when optional packages are
installed, which would make admission depend on the environment).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

from jsonschema import Draft201909Validator, Draft202012Validator, SchemaError
from jsonschema.exceptions import ValidationError as JsonSchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, PrivateAttr, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic.functional_serializers import model_serializer
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError
from referencing import Registry
from referencing.exceptions import Unresolvable

from executor.core.tools import ToolDeclarationError

MAX_DETAILS = 20
_MAX_PATH_SEGMENT = 64
_MAX_EXPECTED = 200
# Never attached to an error as its input: the rejected value may be a secret.
_WITHHELD = "[withheld]"
_COMPOSITION = ("allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "if", "dependentSchemas")


def effective_input_schema(declared: Mapping[str, Any]) -> dict[str, Any]:
    """The schema toolfence validates against: the declared one, closed to undeclared keys.

    docs/design.md §Admission forbids extra fields at the schema gate, while JSON Schema allows
    them unless told otherwise, and most servers never say. So when the root
    declares neither `additionalProperties` nor `unevaluatedProperties`,
    undeclared top-level keys are refused: with `unevaluatedProperties: false`
    on 2019-09/2020-12 (it sees properties declared through `allOf`/`$ref`),
    with `additionalProperties: false` on older drafts when nothing is composed.
    An explicit declaration (even `true`) is the server's deliberate choice
    and is kept: a tool taking free-form keys must stay callable.
    """
    schema = copy.deepcopy(dict(declared))
    if schema.get("type") != "object":
        raise ToolDeclarationError("an MCP tool's inputSchema must have type 'object' at the root")
    if "additionalProperties" in schema or "unevaluatedProperties" in schema:
        return schema
    validator_cls = _validator_class(schema)
    if validator_cls in (Draft201909Validator, Draft202012Validator):
        schema["unevaluatedProperties"] = False
    elif not any(keyword in schema for keyword in _COMPOSITION):
        schema["additionalProperties"] = False
    return schema


def schema_fingerprint(schema: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def schema_version_of(schema: Mapping[str, Any]) -> int:
    """A `Tool.schema_version` that changes whenever the schema does.

    The intent hash includes the schema version, so an operation id reused
    across a schema change is an `idempotency_conflict`, not a silent match.
    31 bits: the store keeps `schema_version` in a 32-bit signed INTEGER column.
    """
    return int(schema_fingerprint(schema)[:8], 16) & 0x7FFF_FFFF


def _validator_class(schema: Mapping[str, Any]) -> type[Validator]:
    # MCP: an inputSchema without `$schema` is JSON Schema 2020-12. An unknown
    # `$schema` makes jsonschema warn and fall back to its latest draft.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cls: type[Validator] = validator_for(schema, default=Draft202012Validator)
    return cls


def compile_validator(schema: Mapping[str, Any]) -> Validator:
    """A validator for `schema`, or `ToolDeclarationError` if it is not a valid schema.

    The empty `Registry` is deliberate: a `$ref` to a URL is never fetched
    (jsonschema's default would download it, a request the server chooses).
    """
    validator_cls = _validator_class(schema)
    try:
        validator_cls.check_schema(schema)
    except SchemaError as exc:
        raise ToolDeclarationError(f"invalid inputSchema: {exc.message[:200]}") from None
    return validator_cls(schema, registry=Registry())


class McpArguments(BaseModel):
    """Arguments of one MCP tool, validated by its JSON Schema.

    Subclasses are generated by `arguments_model`. Read the arguments with
    `.arguments` (a copy); access rules, approval predicates and business
    checks receive this model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mcp_tool_name: ClassVar[str] = ""
    mcp_input_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    mcp_validator: ClassVar[Validator | None] = None

    _arguments: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def arguments(self) -> dict[str, Any]:
        return copy.deepcopy(self._arguments)

    @model_validator(mode="wrap")
    @classmethod
    def _validate_with_json_schema(cls, value: Any, handler: Any) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise PydanticCustomError("type", "arguments must be a JSON object", {"expected": "object"})
        arguments = copy.deepcopy(dict(value))
        validator = cls.mcp_validator
        if validator is None:
            raise PydanticCustomError(
                "schema_missing", "this tool has no input schema", {"expected": "a generated model"}
            )
        try:
            errors = list(validator.iter_errors(arguments))
        except Unresolvable:
            # The server's schema refers to something it does not contain; refuse
            # rather than guess what it meant.
            raise PydanticCustomError(
                "schema_unresolvable",
                "the tool's input schema has a reference that does not resolve",
                {"expected": "a self-contained schema"},
            ) from None
        if errors:
            raise PydanticValidationError.from_exception_data(
                cls.__name__, _line_errors(errors), hide_input=True
            )
        instance = handler({})
        instance._arguments = arguments
        return instance

    @model_serializer(mode="plain")
    def _dump_arguments(self) -> dict[str, Any]:
        return copy.deepcopy(self._arguments)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # Adapters that show a tool to a model read `model_json_schema()`: it must
        # be the schema the arguments are validated with, not an empty object.
        return copy.deepcopy(cls.mcp_input_schema)


def arguments_model(mcp_tool_name: str, declared_schema: Mapping[str, Any]) -> type[McpArguments]:
    """Generate the input model of one MCP tool (raises `ToolDeclarationError`)."""
    schema = effective_input_schema(declared_schema)
    validator = compile_validator(schema)
    class_name = re.sub(r"\W", "_", mcp_tool_name).strip("_").title().replace("_", "") or "Tool"
    model: type[McpArguments] = type(f"{class_name}McpArguments", (McpArguments,), {"__module__": __name__})
    model.mcp_tool_name = mcp_tool_name
    model.mcp_input_schema = schema
    model.mcp_validator = validator
    return model


# ---------------------------------------------------------------- safe error details


def _line_errors(errors: list[JsonSchemaError]) -> list[InitErrorDetails]:
    """pydantic line errors for jsonschema errors: location, keyword, expectation only.

    jsonschema's own messages quote the rejected value ("'x' is not of type
    'integer'"), so none of them is used.
    """
    ordered = sorted(errors, key=lambda e: (json.dumps(list(e.absolute_path), default=str), str(e.validator)))
    details: list[InitErrorDetails] = []
    seen: set[tuple[tuple[str | int, ...], str]] = set()
    for error in ordered:
        for loc, keyword, expected in _describe(error):
            if (loc, keyword) in seen:
                continue
            seen.add((loc, keyword))
            message = f"does not satisfy '{keyword}'" + (f": expected {expected}" if expected else "")
            # Braces would be read as template fields by pydantic.
            template = message.replace("{", "(").replace("}", ")")
            details.append(
                InitErrorDetails(
                    type=PydanticCustomError(keyword, template, {"expected": expected or keyword}),
                    loc=loc,
                    input=_WITHHELD,
                )
            )
            if len(details) >= MAX_DETAILS:
                return details
    return details


def _segment(part: Any) -> str | int:
    if isinstance(part, int):
        return part
    text = str(part)
    # A key the model invented can be anything; bound what is echoed back of it.
    return text if len(text) <= _MAX_PATH_SEGMENT else text[: _MAX_PATH_SEGMENT - 1] + "…"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _MAX_EXPECTED else text[: _MAX_EXPECTED - 1] + "…"


def _describe(error: JsonSchemaError) -> list[tuple[tuple[str | int, ...], str, str | None]]:
    """One or more (location, keyword, expected) triples for a jsonschema error."""
    path = tuple(_segment(part) for part in error.absolute_path)
    keyword = str(error.validator) if error.validator is not None else "false"
    value = error.validator_value
    instance = error.instance
    if keyword == "required" and isinstance(value, list) and isinstance(instance, Mapping):
        # The missing names come from the schema's list, so naming them is safe.
        return [(path + (_segment(name),), "required", "present") for name in value if name not in instance]
    closes_object = keyword == "additionalProperties" or (
        # Without composition the evaluated properties are exactly the declared ones.
        keyword == "unevaluatedProperties"
        and isinstance(error.schema, Mapping)
        and not any(k in error.schema for k in _COMPOSITION)
    )
    if closes_object and isinstance(instance, Mapping):
        declared = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) else {}
        patterns = error.schema.get("patternProperties", {}) if isinstance(error.schema, Mapping) else {}
        extras = [
            key
            for key in instance
            if key not in declared and not any(re.search(p, str(key)) for p in patterns)
        ]
        if extras:
            return [(path + (_segment(key),), keyword, "no undeclared properties") for key in extras]
    return [(path, keyword, _expected(keyword, value))]


def _expected(keyword: str, value: Any) -> str | None:
    match keyword:
        case "type":
            return " | ".join(value) if isinstance(value, list) else str(value)
        case "enum":
            return "one of " + _short(value)
        case "const":
            return "exactly " + _short(value)
        case "minimum":
            return f">= {value}"
        case "maximum":
            return f"<= {value}"
        case "exclusiveMinimum":
            return f"> {value}"
        case "exclusiveMaximum":
            return f"< {value}"
        case "multipleOf":
            return f"a multiple of {value}"
        case "minLength":
            return f"at least {value} characters"
        case "maxLength":
            return f"at most {value} characters"
        case "pattern":
            return "a string matching " + _short(value)
        case "format":
            return f"format {value}"
        case "minItems":
            return f"at least {value} items"
        case "maxItems":
            return f"at most {value} items"
        case "uniqueItems":
            return "unique items"
        case "minProperties":
            return f"at least {value} properties"
        case "maxProperties":
            return f"at most {value} properties"
        case "additionalProperties" | "unevaluatedProperties":
            return "no undeclared properties"
        case "items" | "prefixItems" | "additionalItems" | "unevaluatedItems":
            return "no undeclared items" if value is False else "valid items"
        case "anyOf":
            return "one of the allowed alternatives"
        case "oneOf":
            return "exactly one of the allowed alternatives"
        case "not":
            return "a value the schema does not exclude"
        case "false":
            return "no value here"
        case "dependentRequired" | "dependencies":
            return "the properties this one depends on"
        case _:
            return None
