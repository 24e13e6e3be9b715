"""An approval card as it is shown and as it is decided: the impact recomputed on
current state, its digest, the tool's display hints, and the tenant's other pending
and in-flight operations on the same resources (decision 0222).

`Service.approvals` builds cards with `card_impact` and `related_operations`;
`Service.decide` calls `check_decided_impact` inside the deciding transaction, so
the impact the decision is checked against is the one computed just before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from executor.core.tools import Registry
from executor.core.types import ErrorCode, ServerContext
from executor.http.models import AmountOut, RelatedOut
from executor.http.problems import ProblemDetail, ProblemError
from executor.store.approval_impacts import card_impact, record_decided_impact
from executor.store.console_reads import active_operations
from executor.store.operator import PendingApproval

IMPACT_UNAVAILABLE = "impact_unavailable"
# The related operations a card lists at most (newest first; `related_count` has them all).
RELATED_SHOWN = 10

__all__ = [
    "IMPACT_UNAVAILABLE", "RELATED_SHOWN", "amounts_of", "card_impact", "check_decided_impact", "iso",
    "record_decided_impact", "related_operations",
]


def iso(moment: float | datetime | None) -> str | None:
    """Epoch seconds, or an aware datetime (the API models' times), as ISO 8601 UTC to
    the second (`2026-12-05T07:53:01Z`)."""
    if moment is None:
        return None
    if isinstance(moment, datetime):
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def amounts_of(registry: Registry, tool_name: str) -> dict[str, AmountOut]:
    tool = registry.get(tool_name)
    if tool is None:
        return {}
    return {name: AmountOut(currency=a.currency, decimals=a.decimals) for name, a in tool.amounts.items()}


def _resources_of(registry: Registry, row: Any) -> frozenset[str]:
    """The resources an operation may change: its approved set, else its tool's
    canonical resource ids; none when they cannot be computed (a tool changed)."""
    if row.approved_resources:
        return frozenset(json.loads(row.approved_resources))
    tool = registry.get(row.tool_name)
    if tool is None or tool.resource_ids is None:
        return frozenset()
    try:
        args = tool.input_model.model_validate(json.loads(row.arguments))
        return frozenset(tool.resource_ids(args, ServerContext.from_json(json.loads(row.context))))
    except Exception:
        return frozenset()


def related_operations(
    conn: Connection, registry: Registry, tenant: str, cards: Iterable[tuple[str, Iterable[str] | None]]
) -> dict[str, tuple[list[RelatedOut], int]]:
    """Per card (operation id, its resources): the tenant's other active operations
    sharing one of them, newest first, at most RELATED_SHOWN, and how many there are."""
    wanted = [(operation_id, frozenset(resources or ())) for operation_id, resources in cards]
    if not any(resources for _, resources in wanted):
        return {operation_id: ([], 0) for operation_id, _ in wanted}
    active = [(row, _resources_of(registry, row)) for row in active_operations(conn, tenant)]
    found: dict[str, tuple[list[RelatedOut], int]] = {}
    for operation_id, resources in wanted:
        sharing = [
            (row, resources & theirs) for row, theirs in active
            if row.operation_id != operation_id and resources & theirs
        ]
        found[operation_id] = (
            [
                RelatedOut(operation_id=row.operation_id, tool=row.tool_name, state=row.state,
                           shared=sorted(shared))
                for row, shared in sharing[:RELATED_SHOWN]
            ],
            len(sharing),
        )
    return found


def check_decided_impact(
    registry: Registry, approval: PendingApproval, shown_digest: str | None
) -> tuple[dict[str, Any], str]:
    """The impact an approval is decided on, recomputed now; refused `impact_changed`
    (409, nothing decided) when `shown_digest` names another, or when it cannot be
    computed (a person may still deny)."""
    impact, digest = card_impact(registry, approval)
    if digest is None:
        raise ProblemError(
            409, ErrorCode.IMPACT_CHANGED,
            "the impact cannot be computed now, so it cannot be approved; it stays pending",
            errors=[ProblemDetail(path="", code=IMPACT_UNAVAILABLE)],
        )
    if shown_digest is not None and shown_digest != digest:
        raise ProblemError(
            409, ErrorCode.IMPACT_CHANGED,
            "the impact has changed since it was shown; read it again and decide on the new figures",
            errors=[ProblemDetail(path="/impact_digest", code="stale", expected=digest)],
        )
    return impact, digest
