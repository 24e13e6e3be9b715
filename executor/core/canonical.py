"""Canonical JSON (RFC 8785) and the intent hash.

The intent hash names *what* an operation does, independent of how the model
spelled it: same tenant, principal, tool, schema version, validated arguments and
resource ids give the same hash, whatever the key order or number formatting.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import rfc8785

from executor.errors import AdmissionError


class NotCanonicalizable(AdmissionError, ValueError):
    """The value has no RFC 8785 form (an integer beyond 2**53, NaN, a non-JSON type)."""


def canonical_json(value: Any) -> bytes:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise NotCanonicalizable(str(exc)) from exc


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
