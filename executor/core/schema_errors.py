"""Safe error details from a pydantic validation error (the schema gate's).

What a refused call's details may say: where, which kind, what was expected;
never the rejected value, nor a message that could quote it, nor the name of an
undeclared key (a secret can be written there as easily as in a value).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from executor.core.types import ErrorDetail

# Messages for error types whose pydantic text could quote the input.
_VALUE_ERROR_TYPES = {"value_error", "assertion_error"}


def _echoes_input(text: str, rejected_input: Any) -> bool:
    """Does `text` quote the rejected value?

    Strings (where secrets live) anywhere in the text; numbers only as a whole
    token, so "100" is not found in "greater than or equal to 1000".
    """
    if isinstance(rejected_input, bytes):
        rejected_input = rejected_input.decode(errors="replace")
    if isinstance(rejected_input, str):
        return len(rejected_input) >= 3 and rejected_input in text
    if isinstance(rejected_input, int | float) and not isinstance(rejected_input, bool):
        token = re.escape(str(rejected_input))
        return re.search(rf"(?<![\w.]){token}(?![\w.])", text) is not None
    return False


def _expected(err: Any) -> str | None:
    ctx = err.get("ctx") or {}
    if err["type"] in _VALUE_ERROR_TYPES:
        return None
    if "expected" in ctx:
        return str(ctx["expected"])
    if "expected_tags" in ctx:
        # union_tag_invalid: its message quotes the rejected tag.
        return str(ctx["expected_tags"])
    message = str(err["msg"])
    if "error" in ctx:
        # Parser errors ("…, invalid character found `x` at 3") can quote the input.
        message = message.replace(str(ctx["error"]), "").rstrip(" ,:")
    return message


ADDITIONAL_PROPERTY = "additional_property"


def _key_position(value: Any, loc: tuple[Any, ...]) -> int | None:
    """The 1-based position of key `loc[-1]` in the object at `loc[:-1]` of `value`."""
    parent = value
    for part in loc[:-1]:
        in_object = isinstance(parent, Mapping) and part in parent
        in_list = isinstance(parent, list) and isinstance(part, int) and 0 <= part < len(parent)
        if in_object or in_list:
            parent = parent[part]
        elif isinstance(parent, Mapping) and isinstance(part, str):
            continue  # a discriminated union's tag in the path, not a key of the value
        else:
            return None
    if not isinstance(parent, Mapping):
        return None
    for position, key in enumerate(parent, start=1):
        if key == loc[-1]:
            return position
    return None


def schema_details(exc: ValidationError, value: Any = None) -> tuple[ErrorDetail, ...]:
    """Safe details from a pydantic error: where, which kind, what was expected.

    The input (`err["input"]`) is deliberately dropped, and so is any message that
    could quote it: custom validators' text, a discriminated union's "input tag
    'x'", a parser's error text, and whatever else contains the rejected value.
    A key the schema does not declare is the model's text (a secret can be put
    there as easily as in a value): it is reported as `additional_property` at
    its object's path, with its position among that object's keys (`<key 2>`),
    never by name.
    """
    details = []
    for err in exc.errors(include_url=False, include_input=True):
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden" and loc:
            position = _key_position(value, loc)
            where = f"<key {position}>" if position is not None else "<key>"
            path = ".".join([*(str(part) for part in loc[:-1]), where])
            details.append(ErrorDetail(path=path, code=ADDITIONAL_PROPERTY, expected="only declared keys"))
            continue
        path = ".".join(str(part) for part in loc)
        expected = _expected(err)
        if expected is not None and _echoes_input(expected, err.get("input")):
            expected = None
        details.append(ErrorDetail(path=path, code=err["type"], expected=expected))
    return tuple(details)
