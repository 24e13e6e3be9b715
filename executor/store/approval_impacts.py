"""The impact an approval is shown and decided on, recomputed on current state
(decision 0222): shared by the HTTP API, the console and the command line, so each
decides on the same figures (`executor/http/cards.py` builds the cards around it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, update

from executor.core.impact import ImpactUnavailable, current_impact, impact_digest
from executor.core.tools import Registry
from executor.core.types import ServerContext
from executor.store.audit import dumps
from executor.store.operator import PendingApproval
from executor.store.schema import approvals


def card_impact(registry: Registry, approval: PendingApproval) -> tuple[dict[str, Any], str | None]:
    """(impact, digest): recomputed now; the stored impact and no digest when it cannot
    be (the tool is gone or changed, its hook failed): nobody approves on that card."""
    tool = registry.get(approval.tool_name)
    if tool is None:
        return approval.impact, None
    try:
        impact = current_impact(
            tool, approval.arguments, ServerContext.from_json(approval.context), approval.resources
        )
    except ImpactUnavailable:
        return approval.impact, None
    return impact, impact_digest(impact)


def record_decided_impact(conn: Connection, approval_id: str, impact: Mapping[str, Any]) -> None:
    """The approval row keeps the impact it was approved on (admission's is replaced)."""
    conn.execute(
        update(approvals).where(approvals.c.approval_id == approval_id).values(impact=dumps(dict(impact)))
    )
