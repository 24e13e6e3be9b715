"""After a reconciler run, the exporter's page agrees with a direct count in the database.

The reconciler's counters come from the `toolfence reconcile` process's
multiprocess files; the gauges from the exporter's own queries. Both are checked
against plain SQL over the operations, the audit trail, the outbox and the receipts.
"""

from __future__ import annotations

import json
from typing import Any

from reconciler_kit import (
    TOOLS_ENV,
    enqueue_one,
    sample,
    scrape,
    stale_operations,
    toolfence,
    wait_leases_expired,
)
from sqlalchemy import func, select

from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import ACTIVE_STATES, audit_events, operations, outbox, receipts
from executor.telemetry.exporter import start as start_exporter
from ledger.service import Ledger

MIX: list[tuple[str, dict[str, Any]]] = [
    ("ledger.credit", {"account_id": "acme-2", "amount_cents": 10}),
    ("ledger.transfer", {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 5}),
    ("ledger.create_invoice", {"account_id": "acme-1", "amount_cents": 99}),  # the ledger has it
    ("ledger.create_invoice", {"account_id": "acme-1", "amount_cents": 98}),  # the ledger has not
    ("ledger.send_notice", {"account_id": "acme-1", "text": "hello"}),
]


def test_exporter_after_a_reconcile_run__gauges_and_counters_match_the_database(
    settings: Settings, ledger: Ledger, fleet_env: dict[str, str]
) -> None:
    engine = make_engine(settings.database_url)
    # Given 100 stale operations of every contract, a transfer waiting for approval
    # and fresh queued calls (no fleet runs: their messages just wait)
    stale = stale_operations(engine, [MIX[i % len(MIX)] for i in range(100)])
    for operation_id, generation in stale[2::5]:
        ledger.create_invoice(
            reference=f"toolfence:{operation_id}", operation_id=operation_id, generation=generation,
            account_id="acme-1", amount_cents=99,
        )
    enqueue_one(engine, "ledger.transfer", source_account="acme-1", target_account="acme-2",
                amount_cents=60_000)
    for _ in range(3):
        enqueue_one(engine, "ledger.credit", account_id="acme-2", amount_cents=1)
    wait_leases_expired(engine)
    # When `toolfence reconcile` runs once and the exporter is scraped
    # (the fresh calls must not count as lost messages however slow the machine is)
    result = toolfence(
        {**fleet_env, **TOOLS_ENV, "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": "3600"}, "reconcile"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["actions"]
    exporter = start_exporter(settings, 0, "127.0.0.1")
    try:
        # The invariant gauges but I2 come from the exporter's first pass, on its own thread.
        assert exporter.database.passes.wait_for(1, timeout=60), exporter.database.passes.status()
        page = scrape(exporter.port)
    finally:
        exporter.stop()
    # Then each database gauge is the direct count
    with engine.connect() as conn:
        by_state = dict(
            conn.execute(select(operations.c.state, func.count()).group_by(operations.c.state)).all()
        )
        unpublished = conn.execute(
            select(func.count()).where(outbox.c.published_at.is_(None))
        ).scalar_one()
        decisions = dict(
            conn.execute(
                select(audit_events.c.decision_code, func.count())
                .where(audit_events.c.actor == "reconciler")
                .group_by(audit_events.c.decision_code)
            ).all()
        )
        multiple_receipts = conn.execute(
            select(func.count()).select_from(
                select(receipts.c.operation_id)
                .where(receipts.c.accepted.is_(True))
                .group_by(receipts.c.operation_id)
                .having(func.count(func.distinct(receipts.c.receipt)) > 1)
                .subquery()
            )
        ).scalar_one()
    for state in ACTIVE_STATES:
        assert sample(page, "toolfence_operations_active", state=state) == by_state.get(state, 0), state
    assert sample(page, "toolfence_reconciliation_pending") == by_state["reconciliation_pending"] == 20
    assert sample(page, "toolfence_outbox_backlog") == unpublished
    assert sample(page, "toolfence_invariant_violations", invariant="I1") == multiple_receipts == 0
    # And the reconciler's counters are its audited decisions, and its own report
    actions = {
        action: sample(page, "toolfence_reconciler_actions_total", action=action)
        for action in ("requeued_stale", "lookup_requeued", "lookup_succeeded", "marked_pending")
    }
    assert actions == report == {
        "requeued_stale": 40, "lookup_requeued": 20, "lookup_succeeded": 20, "marked_pending": 20,
    }
    assert actions["requeued_stale"] + actions["lookup_requeued"] == decisions["requeued_stale"]
    assert actions["lookup_succeeded"] == decisions["lookup_done"]
    assert actions["marked_pending"] == decisions["outcome_unknown_after_lost_lease"]
    terminal = "toolfence_operations_terminal_total"
    assert sample(page, terminal, tool="ledger.send_notice", outcome="reconciliation_pending") == 20
    assert sample(page, terminal, tool="ledger.create_invoice", outcome="succeeded") == by_state["succeeded"]
