"""Request ordering on a real fleet: reads in parallel, writes in proposal order.

docs/design.md §Ordering: writes of one request run in proposal order, each after the previous
one is terminal; reads run in parallel with each other; a read placed after a
write runs once that write is terminal, so it sees it. A write whose predecessor
did not succeed is not run and ends `predecessor_failed`. Results correlate by
call id whatever the order in which operations finish.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetkit import (
    audit,
    audit_by_call,
    call,
    context,
    enqueue_committed,
    handler_invocations,
    outcome,
    terminal_events,
)

from executor.cli.fleet import Fleet
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger.service import Ledger
from outbox.results import wait_for_results


def test_mixed_request__reads_overlap__writes_in_order__results_by_call_id(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given a fleet with four execution slots and two more accounts
    ledger.open_account("acme-3", "acme", 4_242)
    ledger.open_account("acme-4", "acme", 0)
    make_fleet(workers=2, concurrency=2, reconcile_every=None).start()
    engine = make_engine(settings.database_url)
    # ... and a request of two writes and three reads placed after the first write,
    # the reads slowed so that they finish in the reverse of proposal order
    calls = [
        call("w1", "ledger.transfer", source_account="acme-1", target_account="acme-2", amount_cents=700),
        call("r1", "test.slow_balance", account_id="acme-2", delay_ms=1500),
        call("r2", "test.slow_balance", account_id="acme-1", delay_ms=1000),
        call("r3", "test.slow_balance", account_id="acme-3", delay_ms=500),
        call("w2", "ledger.credit", account_id="acme-4", amount_cents=300),
    ]

    # When the producer enqueues them in one transaction and the fleet runs them
    enqueue_committed(engine, calls, context("req-mixed-order"))
    statuses = wait_for_results(engine, "acme", "req-mixed-order", timeout=60)

    # Then every call has exactly one result, in proposal order, with its own tool name
    assert [(s.call_id, s.tool_name) for s in statuses] == [(c.call_id, c.tool_name) for c in calls]
    assert [outcome(s) for s in statuses] == [("succeeded", None)] * 5
    by_call = {s.call_id: s for s in statuses}
    trail = audit_by_call(engine)
    started = {c: next(e.at for e in events if e.to_state == "started") for c, events in trail.items()}
    finished = {c: terminal_events(events)[0].at for c, events in trail.items()}
    # ... the reads ran at the same time: each started before any of them finished
    reads = ("r1", "r2", "r3")
    assert max(started[r] for r in reads) < min(finished[r] for r in reads)
    # ... they finished r3, r2, r1, and each result still belongs to its own call
    assert finished["r3"] < finished["r2"] < finished["r1"]
    assert by_call["r1"].output == {"account_id": "acme-2", "balance_cents": 700}
    assert by_call["r2"].output == {"account_id": "acme-1", "balance_cents": 9_999_300}
    assert by_call["r3"].output == {"account_id": "acme-3", "balance_cents": 4_242}
    # ... the reads placed after w1 started once it was terminal (so they saw it)
    assert min(started[r] for r in reads) >= finished["w1"]
    # ... and the writes ran in proposal order, each once, with one downstream effect
    assert started["w2"] >= finished["w1"]
    assert ledger.balance("acme-4") == 300
    assert sorted(ledger.effect_rows_per_operation().values()) == [1, 1]
    invoked = handler_invocations(engine)
    assert [invoked.get(by_call[c].operation_id) for c in ("w1", "r1", "r2", "r3", "w2")] == [1] * 5


def test_write_after_failed_write__ends_predecessor_failed__never_runs(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given a fleet, and a request whose first write fails terminally downstream
    # (admission cannot know: the downstream refuses at run time)
    make_fleet(workers=1, concurrency=2, reconcile_every=None).start()
    engine = make_engine(settings.database_url)
    calls = [
        call("w1", "test.flaky_credit", account_id="acme-2", amount_cents=100, fail_times=1,
             failure="terminal"),
        call("w2", "ledger.credit", account_id="acme-2", amount_cents=200),
        call("r3", "ledger.get_balance", account_id="acme-2"),
    ]

    # When the fleet runs the request
    handle = enqueue_committed(engine, calls, context("req-pred-failed"))
    statuses = wait_for_results(engine, "acme", "req-pred-failed", timeout=60)

    # Then w1 failed, and w2 ended predecessor_failed without running
    assert [(s.call_id, *outcome(s)) for s in statuses] == [
        ("w1", "failed_terminal", "execution_failed"),
        ("w2", "failed_terminal", "predecessor_failed"),
        ("r3", "succeeded", None),
    ]
    by_call = {s.call_id: s for s in statuses}
    w2 = handle.operation_ids["w2"]
    # ... never reserved: one transition, queued → failed_terminal, at generation 0
    assert [(e.from_state, e.to_state, e.decision_code, e.generation) for e in audit(engine, w2)] == [
        (None, "queued", "admitted", 0),
        ("queued", "failed_terminal", "predecessor_failed", 0),
    ]
    invoked = handler_invocations(engine)
    assert invoked.get(handle.operation_ids["w1"]) == 1
    assert w2 not in invoked
    assert ledger.effects_per_operation() == {}
    # ... and the read placed after it still ran once w2 was terminal, seeing no credit
    assert by_call["r3"].output == {"account_id": "acme-2", "balance_cents": 0}
