"""Reconcilers racing: three sweeps at once over 1,000 stale operations.

The design promises one sweep per run, safe to run twice at once (two cron
hosts, a cron run overlapping a slow one). Here two `toolfence reconcile`
processes and a third reconciler inside the test process sweep the same
backlog at the same time, in small batches so they interleave, and each stale
operation must leave its dead generation exactly once.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reconciler_kit import (
    TOOLS_ENV,
    receipt_rows,
    stale_operations,
    start_toolfence,
    transitions_out_of_stale,
    wait_leases_expired,
    wait_until,
)
from sqlalchemy import func, select

from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import audit_events, operations, outbox
from ledger.service import Ledger
from ledger.tools import registry
from reconciler.sweep import Reconciler, SweepReport

STALE_OPERATIONS = 1000
MIX: list[tuple[str, dict[str, Any]]] = [
    ("ledger.get_balance", {"account_id": "acme-1"}),
    ("ledger.credit", {"account_id": "acme-2", "amount_cents": 10}),
    ("ledger.transfer", {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 5}),
    ("ledger.create_invoice", {"account_id": "acme-1", "amount_cents": 99}),  # the ledger has it
    ("ledger.create_invoice", {"account_id": "acme-1", "amount_cents": 98}),  # the ledger has not
    ("ledger.send_notice", {"account_id": "acme-1", "text": "hello"}),
]


def test_two_reconcile_processes_and_a_third_reconciler__each_stale_operation_resolved_exactly_once(
    settings: Settings, ledger: Ledger, fleet_env: dict[str, str]
) -> None:
    engine = make_engine(settings.database_url)
    # Given 1,000 operations of every effect contract whose workers died holding them
    calls = [MIX[i % len(MIX)] for i in range(STALE_OPERATIONS)]
    chunks = [calls[i::4] for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda chunk: stale_operations(engine, chunk), chunks))
    kinds = {op: (tool, args) for chunk, ops in zip(chunks, made, strict=True)
             for (tool, args), op in zip(chunk, ops, strict=True)}
    # ... and for half of the invoices the ledger did create the invoice before the worker died
    invoiced = {op for op, (tool, args) in kinds.items()
                if tool == "ledger.create_invoice" and args["amount_cents"] == 99}
    for operation_id, generation in invoiced:
        ledger.create_invoice(
            reference=f"toolfence:{operation_id}", operation_id=operation_id, generation=generation,
            account_id="acme-1", amount_cents=99,
        )
    wait_leases_expired(engine)
    env = {
        **fleet_env, **TOOLS_ENV,
        "TOOLFENCE_RECONCILE_BATCH_SIZE": "50",
        "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": "3600",
    }
    # When two `toolfence reconcile` processes and a reconciler in this process sweep at once
    processes = [start_toolfence(env, "reconcile") for _ in range(2)]
    in_process = Reconciler(
        settings.with_(reconcile_batch_size=50, reconcile_queued_after_seconds=3600), engine, registry
    )
    reports: list[SweepReport] = []
    errors: list[BaseException] = []

    def sweep_in_process() -> None:
        try:
            reports.append(in_process.sweep())
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    # Start the third once a process has begun, so all three overlap.
    wait_until(lambda: transitions_out_of_stale(engine), timeout=30, what="a reconcile process to begin",
               interval=0.02)
    thread = threading.Thread(target=sweep_in_process)
    thread.start()
    outputs = [process.communicate(timeout=120) for process in processes]
    thread.join(60)
    # Then every reconciler finished cleanly
    for process, (stdout, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
        reports.append(_report(json.loads(stdout)))
    assert errors == []
    assert all(report.total > 0 for report in reports), [r.as_dict() for r in reports]  # they raced
    # And each stale operation left its dead generation exactly once
    transitions = transitions_out_of_stale(engine)
    assert {key: transitions.get(key, 0) for key in kinds if transitions.get(key, 0) != 1} == {}
    with engine.connect() as conn:
        still_started = conn.execute(
            select(func.count()).where(operations.c.state == "started")
        ).scalar_one()
    assert still_started == 0
    # And the reports add up to one action per operation, by contract
    total = sum((report.actions for report in reports), start=Counter[str]())
    tools = Counter(tool for tool, _ in kinds.values())
    assert total == {
        "requeued_stale": tools["ledger.get_balance"] + tools["ledger.credit"] + tools["ledger.transfer"],
        "lookup_succeeded": len(invoiced),
        "lookup_requeued": tools["ledger.create_invoice"] - len(invoiced),
        "marked_pending": tools["ledger.send_notice"],
    }
    # And each found invoice was recorded once; each requeued operation got one new message
    for operation_id, _ in invoiced:
        assert [r.source for r in receipt_rows(engine, operation_id)] == ["reconciler"]
    with engine.connect() as conn:
        messages = dict(
            conn.execute(select(outbox.c.operation_id, func.count()).group_by(outbox.c.operation_id)).all()
        )
        requeued = set(
            conn.execute(
                select(audit_events.c.operation_id).where(audit_events.c.decision_code == "requeued_stale")
            ).scalars()
        )
    assert len(requeued) == total["requeued_stale"] + total["lookup_requeued"]
    assert {op: n for op, n in messages.items() if n != (2 if op in requeued else 1)} == {}


def _report(data: dict[str, Any]) -> SweepReport:
    report = SweepReport()
    report.actions.update(data["actions"])
    return report
