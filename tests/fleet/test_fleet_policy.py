"""What the worker decides at run time: current access policy, and retries.

docs/design.md §Worker: access is checked again just before running, against current policy
(a revoked permission fails closed, the handler never runs); a retryable
failure goes to `retry_wait` with backoff on the database clock and runs again
within the tool's budget, then ends `retry_budget_exhausted`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleet_tools import FLAKY_RETRY, POLICY_FILE_ENV, write_policy
from fleetkit import (
    audit,
    call,
    context,
    enqueue_committed,
    handler_invocations,
    metric,
    outcome,
)

from executor.cli.fleet import Fleet
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger.service import Ledger
from outbox.results import wait_for_results


def test_permission_revoked_after_admission__permission_denied__handler_never_invoked(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet], fleet_env: dict[str, str]
) -> None:
    # Given alice's transfer and credit, admitted while she may run both
    engine = make_engine(settings.database_url)
    transfer = enqueue_committed(
        engine,
        [call("t", "ledger.transfer", source_account="acme-1", target_account="acme-2", amount_cents=900)],
        context("req-transfer"),
    )
    credit = enqueue_committed(
        engine, [call("c", "ledger.credit", account_id="acme-2", amount_cents=5)], context("req-credit")
    )
    # ... and then her permission to transfer is revoked, before any worker runs it
    write_policy(Path(fleet_env[POLICY_FILE_ENV]), {"ledger.transfer": ["alice"]})

    # When the fleet runs both
    make_fleet(workers=1, concurrency=2, reconcile_every=None).start()
    transferred = wait_for_results(engine, "acme", "req-transfer", timeout=60)
    credited = wait_for_results(engine, "acme", "req-credit", timeout=60)

    # Then the transfer ends permission_denied, decided by the (fenced) owner of
    # generation 1, and its handler was never invoked: no money moved
    assert [outcome(s) for s in transferred] == [("failed_terminal", "permission_denied")]
    operation_id = transfer.operation_ids["t"]
    trail = audit(engine, operation_id)
    assert [(e.from_state, e.to_state, e.decision_code, e.generation) for e in trail] == [
        (None, "queued", "admitted", 0),
        ("queued", "started", "reserved", 1),
        ("started", "failed_terminal", "permission_denied_at_execution", 1),
    ]
    assert operation_id not in handler_invocations(engine)
    assert metric(settings.metrics_dir, "toolfence_handler_invocations_total", tool="ledger.transfer") == 0
    assert ledger.balance("acme-1") == 10_000_000
    # ... while the tool she may still use ran as usual
    assert [outcome(s) for s in credited] == [("succeeded", None)]
    assert handler_invocations(engine) == {credit.operation_ids["c"]: 1}
    assert ledger.effects_per_operation() == {credit.operation_ids["c"]: 1}


def test_retryable_failure__backs_off_and_succeeds_later__past_budget_retry_budget_exhausted(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given two credits through a downstream that fails: twice (within the budget of
    # three attempts), and always
    assert FLAKY_RETRY.max_attempts == 3
    engine = make_engine(settings.database_url)
    recovers = enqueue_committed(
        engine,
        [call("c", "test.flaky_credit", account_id="acme-2", amount_cents=100, fail_times=2)],
        context("req-recovers"),
    )
    never = enqueue_committed(
        engine,
        [call("c", "test.flaky_credit", account_id="acme-2", amount_cents=7, fail_times=99)],
        context("req-never"),
    )

    # When the fleet runs them (the relay promotes due retries; no reconciler)
    make_fleet(workers=1, concurrency=2, reconcile_every=None).start()
    recovered = wait_for_results(engine, "acme", "req-recovers", timeout=60)
    exhausted = wait_for_results(engine, "acme", "req-never", timeout=60)

    # Then the first succeeded on its third attempt, after two retry_wait rounds
    assert [outcome(s) for s in recovered] == [("succeeded", None)]
    recovered_id = recovers.operation_ids["c"]
    trail = audit(engine, recovered_id)
    assert [(e.to_state, e.decision_code, e.generation) for e in trail] == [
        ("queued", "admitted", 0),
        ("started", "reserved", 1),
        ("retry_wait", "upstream_unavailable", 1),
        ("queued", "retry_due", 1),
        ("started", "reserved", 2),
        ("retry_wait", "upstream_unavailable", 2),
        ("queued", "retry_due", 2),
        ("started", "reserved", 3),
        ("succeeded", "succeeded", 3),
    ]
    # ... each wait at least the exponential backoff (0.5 s, then 1 s), on the database clock
    waits = [e.at for e in trail if e.to_state == "retry_wait"]
    dues = [e.at for e in trail if e.decision_code == "retry_due"]
    for attempt, (waited_from, due_at) in enumerate(zip(waits, dues, strict=True), start=1):
        assert due_at - waited_from >= FLAKY_RETRY.initial_backoff_seconds * 2 ** (attempt - 1)
    # ... three handler invocations, one downstream effect
    assert handler_invocations(engine)[recovered_id] == 3
    assert ledger.effect_rows_per_operation() == {recovered_id: 1}
    assert ledger.balance("acme-2") == 100

    # ... and the second ended retry_budget_exhausted after exactly three attempts
    assert [outcome(s) for s in exhausted] == [("failed_terminal", "retry_budget_exhausted")]
    never_id = never.operation_ids["c"]
    assert [e.to_state for e in audit(engine, never_id)] == [
        "queued", "started", "retry_wait", "queued", "started", "retry_wait", "queued", "started",
        "failed_terminal",
    ]
    assert handler_invocations(engine)[never_id] == 3
    assert metric(settings.metrics_dir, "toolfence_retries_total", tool="test.flaky_credit") == 4
