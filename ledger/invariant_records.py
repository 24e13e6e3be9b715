"""The ledger's own records as the invariants take them: what `toolfence check` reads
beside toolfence's tables when the ledger's are in the same database.

A downstream of your own can do the same: an object with `name`, `touched`,
`effects` and `refusals` (`executor.store.invariant_reader.Downstream`) over the
tables where it records what it accepted and refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, inspect, select, union

from executor.core import invariants
from executor.store.invariant_reader import among
from ledger.service import effects, fenced_writes

# The ledger's effects that refuse a stale fencing token (`transfer`, effect `fenced`).
FENCED_EFFECT_KINDS = frozenset({"transfer"})


class LedgerRecords:
    """`ledger_effects` and `ledger_fenced`, by operation id (`Downstream`)."""

    name = "ledger"

    def touched(self, since: float | None) -> Select[Any]:
        effect_ids = select(effects.c.operation_id)
        refusal_ids = select(fenced_writes.c.operation_id)
        if since is not None:
            effect_ids = effect_ids.where(effects.c.at >= since)
            refusal_ids = refusal_ids.where(fenced_writes.c.at >= since)
        return select(union(effect_ids, refusal_ids).subquery().c.operation_id)

    def effects(self, conn: Connection, operation_ids: Sequence[str]) -> list[invariants.EffectRecord]:
        return [
            invariants.EffectRecord(
                e.operation_id, e.receipt, int(e.generation), float(e.at), e.kind,
                fenced=e.kind in FENCED_EFFECT_KINDS,
            )
            for e in conn.execute(
                select(effects.c.operation_id, effects.c.receipt, effects.c.generation, effects.c.at,
                       effects.c.kind).where(among(conn, effects.c.operation_id, operation_ids))
            )
        ]

    def refusals(self, conn: Connection, operation_ids: Sequence[str]) -> list[invariants.RefusalRecord]:
        return [
            invariants.RefusalRecord(f.operation_id, int(f.token), float(f.at))
            for f in conn.execute(
                select(fenced_writes.c.operation_id, fenced_writes.c.token, fenced_writes.c.at)
                .where(among(conn, fenced_writes.c.operation_id, operation_ids))
            )
        ]


def ledger_records_if_present(conn: Connection) -> LedgerRecords | None:
    """The ledger's records when its tables are in this database, else None."""
    tables = inspect(conn)
    if tables.has_table(effects.name) and tables.has_table(fenced_writes.name):
        return LedgerRecords()
    return None
