"""A worker dies holding an operation; the reconciler settles it by the tool's effect contract.

A worker's *main* process killed with SIGKILL leaves its broker message unacked
until the Redis visibility timeout (an hour), so nothing but the reconciler can
bring the operation back. Each test starts the worker to be killed in a fleet of
its own (with the fault point only in its environment), kills it, and only then
starts a healthy fleet with a reconciler.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from reconciler_kit import (
    TOOLS_ENV,
    audit,
    counter,
    enqueue_one,
    kill_worker_group,
    ledger_effect_rows,
    logs_on_failure,
    operation,
    owner_pid,
    receipt_rows,
    sample,
    scrape,
    state_of,
    toolfence,
    wait_until,
)
from sqlalchemy import select

from executor.cli.fleet import Fleet
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.telemetry.exporter import start as start_exporter
from ledger.service import Ledger, invoices

MakeFleet = Callable[..., Fleet]
HANDLER_INVOCATIONS = "toolfence_handler_invocations_total"


def doomed_fleet(make_fleet: MakeFleet, fault: str) -> Fleet:
    """A relay and one worker that carries the fault point; no reconciler."""
    return make_fleet(
        workers=1, concurrency=1, relays=1, reconcile_every=None,
        env={**TOOLS_ENV, "TOOLFENCE_FAULT_POINTS": fault},
    ).start()


def healthy_fleet(make_fleet: MakeFleet) -> Fleet:
    """One worker without faults and a reconciler sweeping every 0.3 s."""
    return make_fleet(workers=1, concurrency=1, relays=0, reconcile_every=0.3, env=TOOLS_ENV).start()


@pytest.mark.parametrize(
    ("fault", "effect_before_kill"),
    [
        pytest.param("before_run:ledger.transfer=sleep30", False, id="killed_before_the_effect"),
        pytest.param("after_effect:ledger.transfer=sleep30", True, id="killed_after_the_effect"),
    ],
)
def test_fenced_write__worker_main_process_killed__reconciler_requeues_and_it_completes_once(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet, fault: str, effect_before_kill: bool
) -> None:
    engine = make_engine(settings.database_url)
    # Given a worker running a fenced transfer, held inside its run by a fault point
    doomed = doomed_fleet(make_fleet, fault)
    fleets = [doomed]
    with logs_on_failure(*fleets):
        operation_id = enqueue_one(
            engine, "ledger.transfer", source_account="acme-1", target_account="acme-2",
            amount_cents=700,
        )
        [doomed_worker] = doomed.by_role("worker")
        wait_until(
            lambda: owner_pid(engine, operation_id) in doomed.worker_children()[doomed_worker.pid],
            timeout=20, what="the doomed worker's pool child to reserve the transfer",
        )
        if effect_before_kill:
            wait_until(lambda: ledger_effect_rows(engine, operation_id), timeout=10,
                       what="the ledger to accept the transfer")
        # When its main process and pool child are SIGKILLed, and a healthy fleet starts
        kill_worker_group(doomed)
        healthy = healthy_fleet(make_fleet)
        fleets.append(healthy)
    with logs_on_failure(*fleets):
        wait_until(lambda: state_of(engine, operation_id) == "succeeded", timeout=30,
                   what="the transfer to succeed")
        # Then the reconciler requeued the dead generation, and a new one completed it
        op = operation(engine, operation_id)
        trail = [(e.from_state, e.to_state, e.decision_code, e.generation, e.actor)
                 for e in audit(engine, operation_id)]
        assert trail == [
            (None, "queued", "admitted", 0, None),
            ("queued", "started", "reserved", 1, None),
            ("started", "queued", "requeued_stale", 1, "reconciler"),
            ("queued", "started", "reserved", 2, None),
            ("started", "succeeded", "succeeded", 2, None),
        ]
        assert op.generation == 2
        # And the money moved once: one effect, one distinct receipt
        effects = ledger_effect_rows(engine, operation_id)
        assert len(effects) == 1
        assert {r.receipt for r in receipt_rows(engine, operation_id) if r.accepted} == {op.receipt}
        assert effects[0].receipt == op.receipt
        assert ledger.balance("acme-2") == 700
        invocations = counter(settings.metrics_dir or "", HANDLER_INVOCATIONS, tool="ledger.transfer")
        assert invocations == (2 if effect_before_kill else 1)


def test_lookup_write__worker_killed_after_the_effect__reconciler_records_the_ledger_answer(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet
) -> None:
    engine = make_engine(settings.database_url)
    # Given a worker that dies right after the ledger created the invoice, before completing
    doomed = doomed_fleet(make_fleet, "after_effect:ledger.create_invoice=kill")
    fleets = [doomed]
    with logs_on_failure(*fleets):
        operation_id = enqueue_one(engine, "ledger.create_invoice", account_id="acme-1", amount_cents=1234)
        wait_until(lambda: ledger_effect_rows(engine, operation_id), timeout=20,
                   what="the ledger to create the invoice")
        # When a healthy fleet with a reconciler runs
        healthy = healthy_fleet(make_fleet)
        fleets.append(healthy)
    with logs_on_failure(*fleets):
        wait_until(lambda: state_of(engine, operation_id) != "started", timeout=30,
                   what="the reconciler to settle the invoice")
        # Then the reconciler asked the ledger and recorded its answer as the result
        op = operation(engine, operation_id)
        with engine.connect() as conn:
            invoice_ids = conn.execute(
                select(invoices.c.invoice_id).where(invoices.c.reference == f"toolfence:{operation_id}")
            ).scalars().all()
        assert (op.state, op.generation) == ("succeeded", 1)
        assert invoice_ids == [op.receipt]
        assert json.loads(op.result)["output"]["receipt"] == op.receipt
        by_reconciler = [r.receipt for r in receipt_rows(engine, operation_id) if r.source == "reconciler"]
        assert by_reconciler == [op.receipt]
        [settled] = [e for e in audit(engine, operation_id) if e.from_state == "started"]
        assert (settled.to_state, settled.decision_code, settled.actor) == (
            "succeeded", "lookup_done", "reconciler",
        )
        # And the effect happened once, by one handler invocation
        assert len(ledger_effect_rows(engine, operation_id)) == 1
        assert counter(settings.metrics_dir or "", HANDLER_INVOCATIONS, tool="ledger.create_invoice") == 1


def test_unsafe_write__worker_killed_after_the_effect__pending_for_a_person_then_resolved(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet, fleet_env: dict[str, str]
) -> None:
    engine = make_engine(settings.database_url)
    cli_env = {**fleet_env, **TOOLS_ENV}
    metrics_dir = settings.metrics_dir or ""
    # Given a worker that dies right after the notice went out, before completing
    doomed = doomed_fleet(make_fleet, "after_effect:ledger.send_notice=kill")
    fleets = [doomed]
    with logs_on_failure(*fleets):
        operation_id = enqueue_one(engine, "ledger.send_notice", account_id="acme-1", text="hello")
        wait_until(lambda: ledger_effect_rows(engine, operation_id), timeout=20,
                   what="the ledger to send the notice")
        # When a healthy fleet with a reconciler runs
        healthy = healthy_fleet(make_fleet)
        fleets.append(healthy)
    exporter = start_exporter(settings, 0, "127.0.0.1")
    try:
        with logs_on_failure(*fleets):
            wait_until(lambda: state_of(engine, operation_id) == "reconciliation_pending", timeout=30,
                       what="the reconciler to hand the notice to a person")
            time.sleep(1.5)  # a few more sweeps and a healthy worker: still nobody retries it
            # Then it waits for a person and was never retried
            op = operation(engine, operation_id)
            assert (op.state, op.generation, op.attempts) == ("reconciliation_pending", 1, 1)
            assert [e.decision_code for e in audit(engine, operation_id)] == [
                "admitted", "reserved", "outcome_unknown_after_lost_lease",
            ]
            [effect] = ledger_effect_rows(engine, operation_id)
            assert counter(metrics_dir, HANDLER_INVOCATIONS, tool="ledger.send_notice") == 1
            # And it is visible: in the metrics and in the operator's listing
            assert counter(metrics_dir, "toolfence_reconciler_actions_total", action="marked_pending") == 1
            page = scrape(exporter.port)
            assert sample(page, "toolfence_reconciliation_pending") == 1
            assert sample(page, "toolfence_reconciler_actions_total", action="marked_pending") == 1
            listed = toolfence(cli_env, "pending")
            assert listed.returncode == 0, listed.stderr
            [pending] = json.loads(listed.stdout)
            assert (pending["operation_id"], pending["tool"], pending["reason"]) == (
                operation_id, "ledger.send_notice", "outcome_unknown_after_lost_lease",
            )
            # When an operator checks the ledger and resolves it, naming the notice it found
            resolved = toolfence(
                cli_env, "resolve", operation_id, "succeeded", "--tenant", pending["tenant"],
                "--principal", "ops", "--reference", effect.receipt,
            )
            # Then it is succeeded, audited with the actor, and gone from the listing
            assert resolved.returncode == 0, resolved.stderr
            op = operation(engine, operation_id)
            assert (op.state, op.receipt) == ("succeeded", effect.receipt)
            last = audit(engine, operation_id)[-1]
            assert (last.from_state, last.to_state, last.decision_code, last.actor) == (
                "reconciliation_pending", "succeeded", "resolved_succeeded", "ops",
            )
            assert json.loads(toolfence(cli_env, "pending").stdout) == []
            page = scrape(exporter.port)
            assert sample(page, "toolfence_reconciliation_pending") == 0
            # One effect: the operator's reference is the worker's receipt, so I1 holds
            assert {r.receipt for r in receipt_rows(engine, operation_id) if r.accepted} == {effect.receipt}
            assert sample(page, "toolfence_invariant_violations", invariant="I1") == 0
            # And a second resolution is refused (it is no longer pending)
            again = toolfence(
                cli_env, "resolve", operation_id, "failed", "--tenant", pending["tenant"],
                "--principal", "ops",
            )
            assert again.returncode == 1 and "not reconciliation_pending" in again.stderr
            assert counter(metrics_dir, HANDLER_INVOCATIONS, tool="ledger.send_notice") == 1
    finally:
        exporter.stop()

