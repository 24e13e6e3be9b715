"""A read's freshness through a real fleet on PostgreSQL and Redis: observed_at is
the database clock of its completion, and an idempotent replay later returns the
same stored observation, older, without running the read again."""

from __future__ import annotations

import json
import time

from sqlalchemy import func, select

from executor import store
from executor.core.types import ProposedCall, ServerContext, Succeeded
from executor.store.engine import make_engine
from executor.store.schema import audit_events
from ledger.tools import registry
from outbox.producer import enqueue
from outbox.results import wait_for_results


def _balance(call_id: str) -> ProposedCall:
    return ProposedCall(
        call_id=call_id, tool_name="ledger.get_balance", arguments=json.dumps({"account_id": "acme-1"})
    )


def _context(request_id: str) -> ServerContext:
    return ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id=request_id)


def test_read__real_fleet__observed_at_on_database_clock_and_replay_reports_its_age(
    settings, ledger, make_fleet
):
    # Given a fleet of one worker and a balance read it ran
    fleet = make_fleet(workers=1, concurrency=1).start()
    engine = make_engine(settings.database_url)
    with engine.connect() as conn:
        before = store.read_now(conn)
    with engine.begin() as conn:
        handle = enqueue(conn, [_balance("r1")], _context("req-fresh"), registry)
    [first] = wait_for_results(engine, "acme", "req-fresh", timeout=30)
    assert isinstance(first, Succeeded), (first, fleet.logs())
    operation_id = handle.operation_ids["r1"]
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
        after = store.read_now(conn)
    # Then its observed_at is the completion's database clock
    assert row is not None and first.observed_at == row.finished_at
    assert first.observed_at is not None and before <= first.observed_at <= after
    assert first.stale is False and first.age_seconds is not None
    # When the application retries the same operation a little later
    time.sleep(1.0)
    with engine.begin() as conn:
        replay = enqueue(
            conn, [_balance("r1")], _context("req-fresh-retry"), registry,
            operation_ids={"r1": operation_id},
        )
    [again] = [c.status for c in replay.calls]
    # Then it gets the same stored observation, a second older, and nothing ran again
    assert isinstance(again, Succeeded)
    assert (again.output, again.observed_at) == (first.output, first.observed_at)
    assert again.age_seconds is not None and again.age_seconds >= first.age_seconds + 1.0
    assert again.stale is False  # ledger.get_balance declares no max age
    with engine.connect() as conn:
        starts = conn.execute(
            select(func.count()).select_from(audit_events).where(
                audit_events.c.operation_id == operation_id, audit_events.c.to_state == "started"
            )
        ).scalar_one()
    assert starts == 1
