"""Workers that die or freeze in the middle of a fenced write (docs/design.md §Worker,
"Downstream", "Completion", "Reconciler"; invariants I1 and I3).

The fenced write is `ledger.transfer`: the ledger refuses a fencing token below
the highest it has seen for the key, in the effect's own transaction, and dedupes
on the key so that a new generation never repeats an effect already applied.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fleet_tools import invocations
from fleetkit import (
    accepted_receipts,
    audit,
    call,
    context,
    enqueue_committed,
    metric,
    metric_by_label,
    operation,
    owner_pid,
    table_count,
    terminal_events,
    wait_until,
    worker_of,
)
from sqlalchemy import Engine, select

from executor.cli.fleet import Fleet, children_of, process_alive
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import outbox, receipts
from ledger.service import Ledger, fenced_writes

MESSAGES = "toolfence_worker_messages_total"
FENCED = "toolfence_stale_writes_fenced_total"
TRANSFER = {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 700}

# How a test holds a worker inside its write long enough to strike:
WINDOWS = {
    # the ledger sleeps before opening the effect's transaction
    "in_downstream_call": {"TOOLFENCE_LEDGER_LATENCY_MS": "1500"},
    # the effect committed; the worker sleeps before recording completion
    "after_effect": {"TOOLFENCE_FAULT_POINTS": "after_effect:ledger.transfer=sleep2"},
}


def _invocations_of(engine: Engine, operation_id: str) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(invocations.c.generation, invocations.c.pid)
            .where(invocations.c.operation_id == operation_id)
            .order_by(invocations.c.invocation_id)
        ).all()
    return [(row.generation, row.pid) for row in rows]


def _inside_window(engine: Engine, ledger: Ledger, operation_id: str, window: str) -> bool:
    if window == "in_downstream_call":
        return bool(_invocations_of(engine, operation_id))  # recorded just before the call
    return ledger.effect_rows_per_operation().get(operation_id) == 1


def _snapshot(engine: Engine, operation_id: str) -> tuple[Any, ...]:
    """Everything a stale owner could try to change about an operation."""
    with engine.connect() as conn:
        receipt_rows = conn.execute(
            select(receipts.c.generation, receipts.c.receipt, receipts.c.accepted)
            .where(receipts.c.operation_id == operation_id)
            .order_by(receipts.c.receipt_row_id)
        ).all()
    row = dataclasses.astuple(operation(engine, operation_id))
    trail = tuple(tuple(event) for event in audit(engine, operation_id))
    return row, trail, tuple(tuple(receipt) for receipt in receipt_rows)


@pytest.mark.parametrize(
    ("broker_url", "window"),
    [("redis", "in_downstream_call"), ("redis", "after_effect"), ("rabbitmq", "after_effect")],
    indirect=["broker_url"],
)
def test_pool_child_killed_in_fenced_write__redelivered__completes_once_after_lease_expiry(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet], window: str
) -> None:
    # Given two workers, a reconciler, and a fenced transfer. Whichever finds the dead
    # owner's lease expired first completes it: the message Celery requeues when the
    # child is lost (reject_on_worker_lost), or the reconciler's requeue. (In practice
    # the redelivery arrives while the lease is still live, is acknowledged as
    # `not_ready`, and the reconciler's requeue is what completes it.)
    fleet = make_fleet(workers=2, concurrency=1, reconcile_every=0.5, env=WINDOWS[window]).start()
    engine = make_engine(settings.database_url)
    handle = enqueue_committed(engine, [call("t", "ledger.transfer", **TRANSFER)], context("req-kill"))
    operation_id = handle.operation_ids["t"]

    # When the pool child running it is SIGKILLed inside the window
    wait_until(lambda: _inside_window(engine, ledger, operation_id, window), timeout=60,
               what=f"a worker to be {window}")
    victim = owner_pid(engine, operation_id)
    assert victim is not None
    worker = worker_of(fleet, victim)
    assert victim != worker.pid, "the owner must be a pool child, not the worker's main process"
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not process_alive(victim), timeout=10, what="the pool child to die")
    killed = operation(engine, operation_id)
    assert (killed.state, killed.generation) == ("started", 1)

    # Then the operation succeeds once, at a later generation handed out only after
    # the dead owner's lease expired
    wait_until(lambda: operation(engine, operation_id).state == "succeeded", timeout=60,
               what="the operation to succeed", show=lambda: audit(engine, operation_id))
    final = operation(engine, operation_id)
    assert final.generation >= 2
    trail = audit(engine, operation_id)
    second = next(e for e in trail if e.to_state == "started" and e.generation >= 2)
    assert second.at >= killed.lease_expires_at
    assert [(e.to_state, e.generation) for e in terminal_events(trail)] == [("succeeded", final.generation)]
    # ... with one side effect (the ledger's records and toolfence's receipts agree)
    assert ledger.effect_rows_per_operation() == {operation_id: 1}
    assert accepted_receipts(engine) == {operation_id: 1}
    assert ledger.balance("acme-2") == 700
    # ... run by the killed child at generation 1 and by another process after it
    runs = _invocations_of(engine, operation_id)
    assert runs[0] == (1, victim) and len(runs) == 2 and runs[1][1] != victim, runs
    # ... the killed delivery came back (reject_on_worker_lost): the workers handled one
    # message more than the relay published, the killed one never having been counted
    published = lambda: table_count(engine, outbox, outbox.c.published_at.is_not(None))  # noqa: E731
    wait_until(lambda: metric(settings.metrics_dir, MESSAGES) == published(), timeout=20,
               what="the redelivered message to be handled",
               show=lambda: (published(), metric_by_label(settings.metrics_dir, MESSAGES, "outcome")))
    # ... and the worker survived with a fresh pool child
    assert worker.alive() and children_of(worker.pid)
    assert "SIGKILL" in Path(worker.log_path).read_text(errors="replace")


@pytest.mark.parametrize("window", ["in_downstream_call", "after_effect"])
def test_worker_stopped_past_lease__taken_over__stale_write_renew_and_complete_fenced(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet], window: str
) -> None:
    # Given two workers, a reconciler, and a fenced transfer
    fleet = make_fleet(workers=2, concurrency=1, reconcile_every=0.5, env=WINDOWS[window]).start()
    engine = make_engine(settings.database_url)
    handle = enqueue_committed(engine, [call("t", "ledger.transfer", **TRANSFER)], context("req-stop"))
    operation_id = handle.operation_ids["t"]

    # When the worker running it (main process and pool child) is stopped inside the window
    wait_until(lambda: _inside_window(engine, ledger, operation_id, window), timeout=60,
               what=f"a worker to be {window}")
    owner = owner_pid(engine, operation_id)
    assert owner is not None
    stale = worker_of(fleet, owner)
    os.killpg(stale.pid, signal.SIGSTOP)
    # ... past its lease, until the other worker has taken over and finished
    wait_until(lambda: operation(engine, operation_id).state == "succeeded", timeout=60,
               what="another worker to take over and succeed", show=lambda: audit(engine, operation_id))
    assert Path(f"/proc/{owner}/stat").read_text().split(")")[-1].split()[0] == "T"
    before = _snapshot(engine, operation_id)
    final = operation(engine, operation_id)
    assert final.generation >= 2
    # ... and then the stale worker is resumed
    os.killpg(stale.pid, signal.SIGCONT)

    # Then its late write is refused: downstream by the fence, or at completion by the CAS
    stage = "downstream" if window == "in_downstream_call" else "complete"
    wait_until(lambda: metric(settings.metrics_dir, FENCED, stage=stage) >= 1, timeout=30,
               what=f"the stale {stage} to be fenced",
               show=lambda: metric_by_label(settings.metrics_dir, FENCED, "stage"))
    if window == "in_downstream_call":
        with engine.connect() as conn:
            refused = conn.execute(select(fenced_writes.c.operation_id, fenced_writes.c.token,
                                          fenced_writes.c.highest_token)).all()
        assert [tuple(r) for r in refused] == [(operation_id, 1, final.generation)]
    wait_until(lambda: metric(settings.metrics_dir, MESSAGES) >= 2, timeout=30,
               what="the stale worker to finish its message")
    # ... its renewal and completion changed nothing: one terminal transition, at the
    # new generation, and the same row and audit trail as before it woke; the receipt
    # it holds may be recorded now (a stale owner's receipt is evidence, I1), and it
    # is the one the operation already has
    after = _snapshot(engine, operation_id)
    assert after[:2] == before[:2]
    assert {r[1] for r in after[2]} == {r[1] for r in before[2]} == {final.receipt}
    trail = audit(engine, operation_id)
    assert [(e.to_state, e.generation) for e in terminal_events(trail)] == [("succeeded", final.generation)]
    # ... and the transfer happened once
    assert ledger.effect_rows_per_operation() == {operation_id: 1}
    assert accepted_receipts(engine) == {operation_id: 1}
    assert ledger.balance("acme-2") == 700
    assert stale.alive()
