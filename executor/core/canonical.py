"""Canonical JSON (RFC 8785) and the intent hash.

The intent hash names *what* an operation does, independent of how the model
spelled it: same tenant, principal, tool, schema version, validated arguments and
resource ids give the same hash, whatever the key order or number formatting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import rfc8785

from executor.errors import AdmissionError


class NotCanonicalizable(AdmissionError, ValueError):
    """The value has no RFC 8785 form (an integer beyond 2**53, NaN, a non-JSON type)."""


def canonical_json(value: Any) -> bytes:
    if _plain(value, 0):
        # The same bytes as RFC 8785 for these values (decision 0234): the stdlib's C
        # encoder instead of the pure-Python one, several times faster.
        return _PLAIN.encode(value).encode("utf-8")
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise NotCanonicalizable(str(exc)) from exc


_PLAIN = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)
_MAX_SAFE = 2**53 - 1
_MAX_PLAIN_DEPTH = 64


def _plain_text(text: str) -> bool:
    """Text the stdlib writes as RFC 8785 does, and sorts as it does: no surrogate
    (RFC 8785 escapes a lone one; a well-formed pair is one code point above the
    Basic Multilingual Plane), nothing above U+FFFF (RFC 8785 sorts keys by UTF-16
    code units, Python by code points: the two orders differ only there)."""
    return text.isascii() or max(text) <= "\ud7ff" or (
        all(c < "\ud800" or "\ue000" <= c <= "\uffff" for c in text)
    )


def _plain(value: Any, depth: int) -> bool:
    """Is `value` made only of what the stdlib's encoder writes byte for byte as RFC
    8785 (`_PLAIN`: sorted keys, no spaces, non-ASCII as itself, the same escapes:
    \\b \\f \\n \\r \\t, other control characters as lowercase \\u00xx)? Exactly dict,
    list, str, bool, None and int within +-(2**53 - 1): no float (number formatting
    differs), no subclass (an enum's text), no tuple. Anything else goes to rfc8785."""
    kind = type(value)
    if kind is str:
        return _plain_text(value)
    if kind is bool or value is None:
        return True
    if kind is int:
        return bool(-_MAX_SAFE <= value <= _MAX_SAFE)
    if depth >= _MAX_PLAIN_DEPTH:
        return False
    if kind is dict:
        return all(
            type(key) is str and _plain_text(key) and _plain(item, depth + 1) for key, item in value.items()
        )
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    return False


def intent_hash(
    *,
    tenant: str,
    principal: str,
    tool_name: str,
    schema_version: int,
    arguments: dict[str, Any],
    resource_ids: Iterable[str] = (),
    approved_resources: Iterable[str] | None = None,
) -> str:
    document: dict[str, Any] = {
        "tenant": tenant,
        "principal": principal,
        "tool": tool_name,
        "schema_version": schema_version,
        "arguments": arguments,
        "resource_ids": sorted(set(resource_ids)),
    }
    if approved_resources is not None:
        # Only for tools that declare `resources`: every other tool's hash is unchanged,
        # and "declares an empty set" differs from "declares none".
        document["approved_resources"] = sorted(set(approved_resources))
    return hashlib.sha256(canonical_json(document)).hexdigest()
