"""A mixed request through a real fleet on PostgreSQL and a real broker."""

from __future__ import annotations

import json

from sqlalchemy import select

from executor.core.types import ProposedCall, ServerContext
from executor.store.engine import make_engine
from executor.store.schema import audit_events
from ledger.tools import registry
from outbox.producer import enqueue
from outbox.results import wait_for_results


def _call(call_id: str, tool: str, **arguments: object) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool, arguments=json.dumps(arguments))


def test_mixed_request__reads_overlap_writes_ordered__results_by_call_id(settings, ledger, make_fleet):
    # Given a fleet of two workers
    fleet = make_fleet(workers=2, concurrency=2).start()
    engine = make_engine(settings.database_url)
    ctx = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-mixed")
    calls = [
        _call("r1", "ledger.get_balance", account_id="acme-1"),
        _call("w1", "ledger.transfer", source_account="acme-1", target_account="acme-2", amount_cents=700),
        _call("r2", "ledger.get_balance", account_id="acme-2"),
        _call("w2", "ledger.credit", account_id="acme-2", amount_cents=300),
        _call("r3", "ledger.get_balance", account_id="acme-2"),
    ]
    # When the producer enqueues them in its own transaction
    with engine.begin() as conn:
        enqueue(conn, calls, ctx, registry)
    statuses = wait_for_results(engine, "acme", "req-mixed", timeout=30)
    # Then every call has one result, by call id, in proposal order
    assert [s.call_id for s in statuses] == ["r1", "w1", "r2", "w2", "r3"], fleet.logs()
    assert all(s.status == "succeeded" for s in statuses), (statuses, fleet.logs())
    by_id = {s.call_id: s for s in statuses}
    assert by_id["r2"].output["balance_cents"] == 700  # read after w1 sees it
    assert by_id["r3"].output["balance_cents"] == 1000  # read after w2 sees both
    with engine.connect() as conn:
        events = conn.execute(select(audit_events).order_by(audit_events.c.event_id)).all()
    finished = {e.call_id: e.event_id for e in events if e.to_state == "succeeded"}
    started = {e.call_id: e.event_id for e in events if e.to_state == "started"}
    assert finished["w1"] < started["w2"]  # writes in proposal order
    assert ledger.effects_per_operation() and max(ledger.effects_per_operation().values()) == 1
