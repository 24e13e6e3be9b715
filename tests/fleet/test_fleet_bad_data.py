"""A value the database refuses, through a real fleet on PostgreSQL (decision 0193).

One request holds an account id with a NUL (the ledger's access rule cannot look
it up: psycopg refuses NUL in text), an `unsafe` notice whose text holds a NUL
(admitted: its account is fine; the ledger's insert is refused), and innocent
reads and writes. Only the two bad calls fail, each with a stable code; the
notice fails in a real worker process, terminal, with nothing sent.
"""

from __future__ import annotations

import json

from sqlalchemy import func, select

from executor.core.types import FailedTerminal, ProposedCall, ServerContext
from executor.store.engine import make_engine
from ledger import service as ledger_service
from ledger.tools import registry
from outbox.producer import enqueue
from outbox.results import wait_for_results

REFUSED = {"path": "", "code": "refused_by_database", "expected": "values the database can hold"}


def _call(call_id: str, tool: str, **arguments: object) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool, arguments=json.dumps(arguments))


def test_nul_in_a_batch__only_the_bad_calls_fail__the_notice_terminal_in_a_real_worker(
    settings, ledger, make_fleet
):
    fleet = make_fleet(workers=1, concurrency=2).start()
    engine = make_engine(settings.database_url)
    ctx = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-nul")
    calls = [
        _call("r1", "ledger.get_balance", account_id="acme-1"),
        _call("bad", "ledger.get_balance", account_id="acme-1\u0000"),
        _call("notice", "ledger.send_notice", account_id="acme-1", text="hello\u0000world"),
        _call("r2", "ledger.get_balance", account_id="acme-2"),
    ]
    # When the producer enqueues them (no AdmissionUnavailable for the batch)
    with engine.begin() as conn:
        handle = enqueue(conn, calls, ctx, registry)
    assert [c.status.status for c in handle.calls] == ["pending", "failed_terminal", "pending", "pending"]
    statuses = wait_for_results(engine, "acme", "req-nul", timeout=60)
    by_id = {s.call_id: s for s in statuses}
    # Then the innocent reads succeeded
    assert by_id["r1"].status == "succeeded" and by_id["r2"].status == "succeeded", fleet.logs()
    # And the bad account id was refused at admission, the NUL notice by the worker, both
    # failed_terminal with the same stable code (never reconciliation_pending)
    for call_id in ("bad", "notice"):
        status = by_id[call_id]
        assert isinstance(status, FailedTerminal), (status, fleet.logs())
        assert status.error.code == "invalid_arguments"
        assert [d.model_dump() for d in status.error.details] == [REFUSED]
    # And nothing was sent
    with ledger.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ledger_service.notices)).scalar_one() == 0
    assert ledger.effects_per_operation() == {}
