"""Approved set = changed set: what a write was approved to change against what it changed.

Pure. A write that declares `resources` is admitted (and, when its policy asks,
approved by a person) for exactly that set of resource ids, recorded on its
operation; its handler reports the ids it changed in `Written.changed_resources`.
The rule is containment: changing *fewer* than approved is fine (a downstream may
skip a recipient it has already notified, or one that closed), changing anything
*outside* the set is not, and is never reported `succeeded`.

What is recorded about an excess goes into the operation's `error` JSON, so it is
bounded: at most `RECORDED_IDS_CAP` ids per list, with the full count and how many
were cut beside each list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from executor.errors import AdmissionError

# Admission refuses a declared set larger than this: the approver must be able to
# read it, and the worker keeps it on the operation for the handler.
MAX_DECLARED_RESOURCES = 1000
MAX_RESOURCE_ID_LENGTH = 200
# Ids kept per list in an operation's error JSON (the rest are counted, not stored).
RECORDED_IDS_CAP = 100


class InvalidResourceSet(AdmissionError, ValueError):
    """A `resources` hook returned something that is not a set of resource ids."""


def declared_resources(ids: Iterable[str]) -> frozenset[str]:
    """Validate what a tool's `resources` hook returned: non-empty strings, bounded."""
    if isinstance(ids, str | bytes):
        # A bare string would be read as a set of its characters.
        raise InvalidResourceSet("resources must be an iterable of ids, not one string")
    found: set[str] = set()
    for resource_id in ids:
        if not isinstance(resource_id, str) or not 0 < len(resource_id) <= MAX_RESOURCE_ID_LENGTH:
            raise InvalidResourceSet(
                f"each resource id must be a string of 1..{MAX_RESOURCE_ID_LENGTH} characters"
            )
        found.add(resource_id)
        if len(found) > MAX_DECLARED_RESOURCES:
            raise InvalidResourceSet(f"more than {MAX_DECLARED_RESOURCES} resources")
    return frozenset(found)


def bounded_ids(ids: Iterable[str], cap: int = RECORDED_IDS_CAP) -> dict[str, Any]:
    """`{"ids": first `cap` in sorted order, "count": all, "omitted": count - kept}`."""
    ordered = sorted(set(ids))
    kept = ordered[:cap]
    return {"ids": kept, "count": len(ordered), "omitted": len(ordered) - len(kept)}


@dataclass(frozen=True)
class ScopeExceeded:
    """A write changed resources outside the set it was approved for."""

    approved: frozenset[str]
    changed: frozenset[str]

    @property
    def outside(self) -> frozenset[str]:
        return self.changed - self.approved

    def error_json(self, receipt: str | None) -> dict[str, Any]:
        """What the operation's `error` keeps for the person who decides it (bounded)."""
        return {
            "message": (
                f"the write changed {len(self.outside)} resource(s) outside the "
                f"{len(self.approved)} it was approved for"
            ),
            "cause": "approval_scope_exceeded",
            "receipt": receipt,
            "approved_resources": bounded_ids(self.approved),
            "changed_resources": bounded_ids(self.changed),
            "outside_approved": bounded_ids(self.outside),
        }


def check_scope(approved: frozenset[str], changed: Iterable[str]) -> ScopeExceeded | None:
    """None when every changed id is in the approved set (changed ⊆ approved)."""
    changed_set = frozenset(changed)
    if changed_set <= approved:
        return None
    return ScopeExceeded(approved=approved, changed=changed_set)
