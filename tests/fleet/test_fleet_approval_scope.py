"""Approved set = changed set, with real worker processes on PostgreSQL and Redis.

Three batches of notices, each approved for 50 accounts: one that sends exactly
those (`ledger.send_notices`, approved by a person), and two whose handler also
notifies a 51st account (`test.overreaching_notices`): through a ledger that lets
it through, and through one that enforces the approved set.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fleet_tools import registry
from fleetkit import audit, call, context, enqueue_committed, handler_invocations, metric, outcome

from executor import store
from executor.cli.fleet import Fleet
from executor.core.types import Pending, ServerContext
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger.service import Ledger
from outbox.results import wait_for_results

ACCOUNTS = [f"acme-n{n:02d}" for n in range(51)]
FIFTY, EXTRA = ACCOUNTS[:50], ACCOUNTS[50]


def test_notice_batches__fifty_approved__fifty_succeed_fifty_one_waits_for_a_person_enforced_sends_none(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given 51 accounts of alice's tenant
    for account_id in ACCOUNTS:
        ledger.open_account(account_id, "acme", 0)
    engine = make_engine(settings.database_url)
    # ... a batch to 50 of them, which a person (bob) approves having seen the accounts
    exact = enqueue_committed(
        engine, [call("n", "ledger.send_notices", account_ids=FIFTY, text="maintenance")],
        context("req-exact"),
    )
    (pending,) = exact.calls
    assert isinstance(pending.status, Pending) and pending.status.impact is not None
    assert pending.status.impact["resource_count"] == 50
    assert pending.status.approval_id is not None
    with engine.begin() as conn:
        bob = ServerContext(
            principal="bob", tenant="acme", roles=frozenset({"approver"}), request_id="approval"
        )
        assert store.approve(conn, pending.status.approval_id, approver=bob, registry=registry).decided
    # ... and two batches admitted for the same 50 whose handler also notifies a 51st
    overreach = {
        enforce: enqueue_committed(
            engine,
            [call("n", "test.overreaching_notices", account_ids=FIFTY, text="hi",
                  also_account=EXTRA, enforce=enforce)],
            context(f"req-overreach-{enforce}"),
        ).operation_ids["n"]
        for enforce in (False, True)
    }

    # When the fleet runs them
    make_fleet(workers=1, concurrency=2, reconcile_every=None).start()
    exact_result = wait_for_results(engine, "acme", "req-exact", timeout=60)
    let_through = wait_for_results(engine, "acme", "req-overreach-False", timeout=60)
    enforced = wait_for_results(engine, "acme", "req-overreach-True", timeout=60)

    # Then the exact batch succeeded: 50 notices
    assert [outcome(s) for s in exact_result] == [("succeeded", None)]
    assert ledger.notices_of_operation(exact.operation_ids["n"]) == sorted(FIFTY)

    # ... the batch the ledger let through changed 51: it happened (receipt kept),
    # but waits for a person with the cause and both sets, and was counted
    assert [(s.status, getattr(s, "state", None)) for s in let_through] == [
        ("pending", "reconciliation_pending")
    ]
    through_id = overreach[False]
    assert ledger.notices_of_operation(through_id) == sorted(ACCOUNTS)
    with engine.connect() as conn:
        row = store.get_operation(conn, through_id)
    assert row is not None and row.receipt is not None
    assert row.error_code == "approval_scope_exceeded"
    error = json.loads(row.error or "{}")
    assert error["approved_resources"]["count"] == 50
    assert error["changed_resources"]["count"] == 51
    assert error["outside_approved"]["ids"] == [f"account:{EXTRA}"]
    assert [e.decision_code for e in audit(engine, through_id)][-1] == "approval_scope_exceeded"
    assert ledger.effects_per_operation()[through_id] == 1
    assert metric(
        settings.metrics_dir, "toolfence_approval_scope_exceeded_total",
        tool="test.overreaching_notices",
    ) == 1

    # ... and the ledger that enforces the set refused the whole batch: nothing sent,
    # the call failed with the cause, its handler ran once
    assert [outcome(s) for s in enforced] == [("failed_terminal", "approval_scope_exceeded")]
    assert ledger.notices_of_operation(overreach[True]) == []
    assert overreach[True] not in ledger.effects_per_operation()
    assert handler_invocations(engine)[overreach[True]] == 1
