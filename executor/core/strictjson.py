"""Strict JSON: the one parser for untrusted JSON text (arguments, CLI input
files, HTTP bodies), bounded in size and depth before it is parsed.

`json.loads` alone keeps the last of two duplicate keys (two parsers of one
document may keep different ones), reads `NaN` and `1e400` as floats no
canonical form represents, and recurses once per nesting level. `loads_strict`
refuses all of these with a `StrictJSONError` whose `code` is stable
(`too_large`, `too_deep`, `duplicate_key`, `non_finite`, `not_utf8`,
`json_syntax`) and whose message never quotes the input. The admission parse
gate uses the same helpers.

Pure: no database, broker or network.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from executor.errors import AdmissionError


def _json_depth_exceeds(text: str, limit: int) -> bool:
    """Nesting depth of JSON text, without recursing (a hostile input cannot blow the stack)."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _value_depth_exceeds(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in item)
    return False


class _DuplicateKey(ValueError):
    """Control flow of the JSON parsers' hooks, turned into a refusal by their callers;
    never reaches a user, so not a `ToolfenceError`."""


class _NonFinite(ValueError):
    """Control flow, like `_DuplicateKey`: not a `ToolfenceError`."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            # Two parsers may keep different copies: refuse rather than guess.
            raise _DuplicateKey("duplicate key")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(literal: str) -> float:
    # `1e400` is valid JSON syntax but Python reads it as inf, which no canonical
    # form (and no downstream) can represent: refuse it like NaN.
    value = float(literal)
    if not math.isfinite(value):
        raise _NonFinite(literal)
    return value


class StrictJSONError(AdmissionError, ValueError):
    """Untrusted JSON text refused; `code` says why, the message never quotes it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def loads_strict(data: str | bytes, *, max_bytes: int, max_depth: int) -> Any:
    """Parse untrusted JSON text: at most `max_bytes` (UTF-8) and `max_depth` levels,
    each key once, finite numbers only, valid UTF-8 (no lone surrogate, even
    escaped). Never raises anything but `StrictJSONError`."""
    if isinstance(data, bytes):
        if len(data) > max_bytes:
            raise StrictJSONError("too_large", f"the document is larger than {max_bytes} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise StrictJSONError("not_utf8", "not UTF-8 text") from None
    else:
        text = data
        if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            raise StrictJSONError("too_large", f"the document is larger than {max_bytes} bytes")
    if _json_depth_exceeds(text, max_depth):
        raise StrictJSONError("too_deep", f"the document is nested deeper than {max_depth} levels")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicate_keys,
            parse_constant=_no_constants,
            parse_float=_finite_float,
        )
    except _DuplicateKey:
        raise StrictJSONError("duplicate_key", "an object repeats a key") from None
    except _NonFinite:
        raise StrictJSONError("non_finite", "a number is too large to represent") from None
    except json.JSONDecodeError as exc:
        # Where, never what: the position is safe to show, the text around it is not.
        raise StrictJSONError(
            "json_syntax", f"not JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    except (ValueError, RecursionError):
        # ValueError: an integer of more than 4,300 digits (Python's limit).
        raise StrictJSONError("json_syntax", "not JSON (a number too long to read)") from None
    if contains_lone_surrogate(value):
        raise StrictJSONError("not_utf8", "not UTF-8 text (a lone surrogate)")
    return value


def contains_lone_surrogate(value: Any) -> bool:
    """Any string (key or value) that is not encodable UTF-8: a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False
