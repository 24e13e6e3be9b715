"""Business rules hold when a call runs, not only when it was proposed.

Two real workers on PostgreSQL run transfers that were each admitted against a
balance that covered them, but together exceed it. The worker's re-check just
before the downstream call refuses those the balance no longer covers, and the
ledger refuses, in the effect's own transaction, the ones that raced past that
check: the balance never goes negative, each refused transfer says why, and no
operation has more than one effect.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from fleetkit import audit, call, context, enqueue_committed, terminal_events
from sqlalchemy import select

from executor.cli.fleet import Fleet
from executor.core.types import FailedTerminal, Succeeded
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger.service import Ledger, effects
from outbox.results import wait_for_results

SOURCE_BALANCE = 100_000  # 1,000.00
AMOUNT = 40_000  # 400.00 each: below the approval threshold, so none waits for a person
TRANSFERS = 8


def test_concurrent_transfers_over_the_balance__never_negative__refusals_say_why(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given an account holding 1,000.00 and eight transfers of 400.00 from it, each
    # admitted (the balance covered each one alone), in eight requests so that they
    # may run at the same time
    ledger.open_account("acme-src", "acme", SOURCE_BALANCE)
    engine = make_engine(settings.database_url)
    requests = [f"req-{n}" for n in range(TRANSFERS)]
    handles = [
        enqueue_committed(
            engine,
            [call("t", "ledger.transfer", source_account="acme-src", target_account="acme-2",
                  amount_cents=AMOUNT)],
            context(request_id),
        )
        for request_id in requests
    ]
    operation_ids = {handle.operation_ids["t"] for handle in handles}
    assert len(operation_ids) == TRANSFERS
    # ... and a ledger slow enough (100 ms before each write) that transfers pass the
    # worker's re-check together and meet in the ledger
    lowest = {"balance": SOURCE_BALANCE}
    done = threading.Event()

    def watch_balance() -> None:
        while not done.is_set():
            lowest["balance"] = min(lowest["balance"], ledger.balance("acme-src"))
            done.wait(0.01)

    watcher = threading.Thread(target=watch_balance, daemon=True)
    watcher.start()

    # When two workers run them
    fleet = make_fleet(
        workers=2, concurrency=2, env={"TOOLFENCE_LEDGER_LATENCY_MS": "100"}
    ).start()
    statuses = [wait_for_results(engine, "acme", request_id, timeout=60)[0] for request_id in requests]
    done.set()
    watcher.join(timeout=5)

    # Then at most two transfers moved money, and the balance never went below zero
    succeeded = [s for s in statuses if isinstance(s, Succeeded)]
    refused = [s for s in statuses if isinstance(s, FailedTerminal)]
    assert len(succeeded) + len(refused) == TRANSFERS, (statuses, fleet.logs())
    assert len(succeeded) == SOURCE_BALANCE // AMOUNT, statuses
    final_balance = ledger.balance("acme-src")
    assert final_balance == SOURCE_BALANCE - AMOUNT * len(succeeded)
    assert final_balance >= 0 and lowest["balance"] >= 0
    assert ledger.balance("acme-2") == AMOUNT * len(succeeded)
    # ... every refused one says why: a business rule, checked at execution by the
    # worker or refused by the ledger itself in its effect's transaction
    assert {(s.error.code.value, s.error.message) for s in refused} == {
        ("business_rule_violation", "insufficient funds")
    }
    decisions = Counter(
        terminal_events(audit(engine, s.operation_id))[-1].decision_code
        for s in refused if s.operation_id is not None
    )
    assert set(decisions) <= {"business_rule_violation_at_execution", "business_rule_violation"}
    assert sum(decisions.values()) == len(refused)
    # ... and no operation has more than one effect in the ledger's own records
    per_operation = ledger.effect_rows_per_operation()
    assert set(per_operation) == {s.operation_id for s in succeeded}
    assert set(per_operation.values()) == {1}
    with ledger.reader.connect() as conn:
        moved = conn.execute(
            select(effects.c.amount_cents).where(effects.c.account_id == "acme-src")
        ).scalars().all()
    assert sum(moved) == SOURCE_BALANCE - final_balance
