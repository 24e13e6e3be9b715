"""Duplicate delivery on a real fleet: correctness never depends on the broker
delivering exactly once (docs/design.md §Defaults); the reservation CAS does.
"""

from __future__ import annotations

from collections.abc import Callable

from fleet_tools import registry
from fleetkit import (
    accepted_receipts,
    all_in,
    audit,
    call,
    context,
    handler_invocations,
    metric,
    metric_by_label,
    on_both_brokers,
    states,
    terminal_events,
    wait_until,
)

from executor.broker.app import TASK_NAME, make_celery
from executor.cli.fleet import Fleet
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger.service import Ledger
from outbox.producer import enqueue

MESSAGES = "toolfence_worker_messages_total"
COPIES = 3


@on_both_brokers
def test_each_operation_published_three_times__runs_once__one_side_effect(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given committed one-call requests: a write of every effect contract and a read, twice
    engine = make_engine(settings.database_url)
    kinds = [
        call("c", "ledger.credit", account_id="acme-2", amount_cents=100),
        call("c", "ledger.transfer", source_account="acme-1", target_account="acme-2", amount_cents=10),
        call("c", "ledger.create_invoice", account_id="acme-2", amount_cents=250),
        call("c", "ledger.send_notice", account_id="acme-2", text="hello"),
        call("c", "ledger.get_balance", account_id="acme-1"),
    ]
    operation_ids: dict[str, str] = {}
    with engine.begin() as conn:
        for i, proposed in enumerate(kinds * 2):
            handle = enqueue(conn, [proposed], context(f"req-dup-{i}"), registry)
            operation_ids[handle.operation_ids["c"]] = proposed.tool_name
    # ... each already published twice, back to back, straight to the broker (the
    # relay publishes it a third time): adjacent copies reach two slots at once
    app = make_celery(settings)
    try:
        for operation_id in operation_ids:
            for _ in range(COPIES - 1):
                app.send_task(TASK_NAME, args=[operation_id], queue=settings.queue_name)
    finally:
        app.close()

    # When a fleet with four slots consumes all of it
    make_fleet(workers=2, concurrency=2, reconcile_every=None).start()

    # Then every operation succeeded
    ids = list(operation_ids)
    wait_until(
        lambda: all_in(engine, ids, {"succeeded"}), timeout=60, what="every operation to succeed",
        show=lambda: states(engine, ids),
    )
    # ... every message was handled, and only one per operation ran the tool
    wait_until(
        lambda: metric(settings.metrics_dir, MESSAGES) == COPIES * len(ids), timeout=20,
        what="every copy to be handled",
        show=lambda: metric_by_label(settings.metrics_dir, MESSAGES, "outcome"),
    )
    outcomes = metric_by_label(settings.metrics_dir, MESSAGES, "outcome")
    assert outcomes.pop("succeeded") == len(ids), outcomes
    assert set(outcomes) <= {"duplicate", "not_ready", "owned_elsewhere"}, outcomes
    # ... one handler invocation per operation, reserved once, never taken over
    invoked = handler_invocations(engine)
    assert {op: invoked.get(op) for op in ids} == {op: 1 for op in ids}
    for op in ids:
        trail = audit(engine, op)
        assert [(e.decision_code, e.generation) for e in trail if e.to_state == "started"] == [
            ("reserved", 1)
        ], trail
        assert len(terminal_events(trail)) == 1, trail
    # ... and one side effect per write, as the ledger and toolfence's receipts both see it
    writes = [op for op, tool in operation_ids.items() if tool != "ledger.get_balance"]
    assert ledger.effect_rows_per_operation() == {op: 1 for op in writes}
    assert accepted_receipts(engine) == {op: 1 for op in writes}
    assert ledger.balance("acme-2") == 2 * (100 + 10)
