"""A native turn's provider-run calls on a real fleet: worker processes load the
application's hosted policy (TOOLFENCE_HOSTED_POLICY) and record every hosted call
of every step through it, on PostgreSQL; a call outside it ends the turn with the
reason stated, and none of that step's proposals runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetkit import wait_until
from sqlalchemy import func, select

from executor.cli.fleet import Fleet
from executor.core.types import ServerContext
from executor.providers import SURFACES, encode_tool_name
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import hosted_calls, operations
from executor.turns.service import get_turn, start_turn
from ledger.service import Ledger

MakeFleet = Callable[..., Fleet]
ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="turn")


def function_call(call_id: str, account: str) -> dict[str, Any]:
    name = encode_tool_name("ledger.get_balance", SURFACES["openai-responses"].name_rule)
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": json.dumps({"account_id": account}), "status": "completed"}


def mcp_call(item_id: str, name: str) -> dict[str, Any]:
    return {"type": "mcp_call", "id": item_id, "server_label": "crm", "name": name, "arguments": "{}",
            "output": "ok", "status": "completed"}


def text(message: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": message, "annotations": []}]}


def test_fleet_turn__hosted_calls__recorded_through_the_workers_policy_and_a_refused_one_ends_the_turn(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet, tmp_path: Path
) -> None:
    # Given a fleet whose workers load the CRM policy (only `lookup` may run)
    make_fleet(workers=1, concurrency=2, relays=1, reconcile_every=0.3,
               env={"TOOLFENCE_HOSTED_POLICY": "turn_policies:CRM"}).start()
    # And a native model that looks a customer up (allowed) and reads a balance, then runs
    # `delete_all` on the CRM (not allowed) beside another read, and says it is done
    script = tmp_path / "turn.jsonl"
    steps = [
        {"output": [mcp_call("mcp_1", "lookup"), function_call("call_1", "acme-1")]},
        {"output": [mcp_call("mcp_2", "delete_all"), function_call("call_2", "acme-2"), text("All tidy.")]},
    ]
    lines = [json.dumps({"status": "completed", **step}) + "\n" for step in steps]
    script.write_text("".join(lines), encoding="utf-8")
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            turn_id = start_turn(conn, ALICE, "conv-1", "Tidy up the CRM",
                                 driver=f"scripted+openai-responses:{script}").turn_id
        # When a worker runs the turn
        view: dict[str, Any] = wait_until(
            lambda: (v := get_turn(engine, "acme", turn_id)) is not None and v["state"] != "running" and v,
            timeout=60, what="the turn to end", show=lambda: get_turn(engine, "acme", turn_id),
        )
        # Then it ends saying why, after step 1's read ran and none of step 2's calls did
        assert (view["state"], view["end_reason"]) == ("fallback", "hosted_call_not_allowed")
        assert view["error"]["calls"] == ["mcp_2"]
        assert [c["status"] for c in view["steps"][0]["calls"]] == ["succeeded"]
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(operations)).scalar_one() == 1
            rows = conn.execute(
                select(hosted_calls.c.request_id, hosted_calls.c.tool_name, hosted_calls.c.allowed)
                .order_by(hosted_calls.c.hosted_call_row_id)
            ).all()
        # And each hosted call is recorded once, under its step, as the worker's policy judged it
        assert [tuple(r) for r in rows] == [
            (f"{turn_id}.s1", "lookup", True), (f"{turn_id}.s2", "delete_all", False),
        ]
    finally:
        engine.dispose()
