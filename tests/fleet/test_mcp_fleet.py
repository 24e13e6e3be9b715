"""An MCP server's tool, end to end through admission, the outbox, the relay and a worker."""

from __future__ import annotations

import json
from pathlib import Path

from executor.core.types import ProposedCall, ServerContext
from executor.mcp import shutdown_connections
from executor.store.engine import make_engine
from outbox.producer import enqueue
from outbox.results import wait_for_results
from tests.fixtures.mcp_fleet_tools import build

ROOT = Path(__file__).resolve().parents[2]


def test_mcp_tool__runs_through_fleet__result_correlated_and_untrusted(settings, ledger, make_fleet):
    # Given a fleet whose workers register mcp-server-time's tools next to the ledger's
    fleet = make_fleet(
        workers=1,
        env={"TOOLFENCE_TOOLS": "tests.fixtures.mcp_fleet_tools:build", "PYTHONPATH": str(ROOT)},
    ).start()
    registry = build()
    shutdown_connections()
    engine = make_engine(settings.database_url)
    ctx = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-mcp")
    calls = [
        ProposedCall(call_id="t1", tool_name="time.get_current_time",
                     arguments=json.dumps({"timezone": "UTC"})),
        # Schema violation (unknown field): refused by the gates before any MCP request.
        ProposedCall(call_id="t2", tool_name="time.get_current_time",
                     arguments=json.dumps({"timezone": "UTC", "tenant_id": "globex"})),
        ProposedCall(call_id="b1", tool_name="ledger.get_balance",
                     arguments=json.dumps({"account_id": "acme-1"})),
    ]
    # When the producer enqueues them
    with engine.begin() as conn:
        enqueue(conn, calls, ctx, registry)
    statuses = wait_for_results(engine, "acme", "req-mcp", timeout=60)
    # Then the MCP call succeeded through the fleet, labelled untrusted, by its own call id
    by_id = {s.call_id: s for s in statuses}
    assert by_id["t1"].status == "succeeded", (statuses, fleet.logs())
    assert by_id["t1"].untrusted is True
    assert "UTC" in json.dumps(by_id["t1"].output)
    assert by_id["t2"].status == "failed_terminal"
    assert by_id["t2"].error.code == "invalid_arguments"
    assert by_id["b1"].status == "succeeded"
    assert by_id["b1"].untrusted is False
