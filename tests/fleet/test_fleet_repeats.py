"""Repeated writes and re-enqueued requests through a real fleet on PostgreSQL and a real
broker: the ledger sees one side effect, every call id gets one result."""

from __future__ import annotations

import json
from typing import Any

from executor.core.types import ProposedCall, ServerContext, Succeeded
from executor.store.engine import make_engine
from ledger.tools import registry
from outbox.producer import enqueue
from outbox.results import wait_for_results

TRANSFER = {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 40_000}


def _transfer(call_id: str) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name="ledger.transfer", arguments=json.dumps(TRANSFER))


def _ctx(request_id: str) -> ServerContext:
    return ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}),
                         request_id=request_id, conversation_id="conv-1")


def _without_age(status: Any) -> dict[str, Any]:
    return status.model_dump(exclude={"age_seconds"})  # type: ignore[no-any-return]


def test_same_transfer_three_times__one_effect__repeats_answered_from_the_first(settings, ledger, make_fleet):
    # Given a fleet and a request in which the model proposed one transfer three times
    fleet = make_fleet(workers=2, concurrency=2).start()
    engine = make_engine(settings.database_url)
    before = ledger.balance("acme-1")
    with engine.begin() as conn:
        enqueue(conn, [_transfer("t1"), _transfer("t2"), _transfer("t3")], _ctx("req-1"), registry)

    # When it has run, and the application enqueues the same request again, and the
    # model proposes the transfer once more in the next request of the conversation
    first = wait_for_results(engine, _ctx("req-1"), timeout=60)
    with engine.begin() as conn:
        again = enqueue(conn, [_transfer("t1"), _transfer("t2"), _transfer("t3")], _ctx("req-1"), registry)
        later = enqueue(conn, [_transfer("t1")], _ctx("req-2"), registry)
    next_turn = wait_for_results(engine, _ctx("req-2"), timeout=60)

    # Then the ledger moved the money once, and every call id has one result
    assert all(isinstance(s, Succeeded) for s in first), (first, fleet.logs())
    assert [s.reused_from_call_id for s in first] == [None, "t1", "t1"]
    assert len({s.operation_id for s in first}) == 1
    # (the same stored results; only their age, measured at each read, has grown)
    assert [_without_age(c.status) for c in again.calls] == [_without_age(s) for s in first]
    assert isinstance(next_turn[0], Succeeded) and next_turn[0].reused_from_call_id == "t1"
    assert later.calls[0].operation_id == first[0].operation_id
    assert ledger.balance("acme-1") == before - 40_000
    assert list(ledger.effects_per_operation().values()) == [1]
