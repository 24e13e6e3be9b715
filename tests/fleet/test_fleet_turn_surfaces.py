"""Turn surfaces on a real fleet: PostgreSQL, Redis, relay, workers and reconciler as
subprocesses loading `fleet_tools:registry`, whose `chat` surface turns writes into
approval cards, offers a catalog without `ledger.send_notice`, and lists the
requester's open items for `test.describe_operation`'s listed argument.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_tools import CHAT_CATALOG, invocation_count, invocations, registry
from fleetkit import wait_until
from sqlalchemy import func, select

from executor import store
from executor.cli.fleet import Fleet
from executor.core.types import ServerContext
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.turns.service import get_turn, start_turn
from ledger.service import Ledger, default_ledger

MakeFleet = Callable[..., Fleet]
ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="turn")
APPROVER = ServerContext(principal="bob", tenant="acme", roles=frozenset({"approver"}), request_id="ap")


def script(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def call(call_id: str, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": tool, "arguments": arguments}


def chat_turn(settings: Settings, path: Path, conversation: str = "conv-1") -> str:
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            return start_turn(conn, ALICE, conversation, "Please help.", driver=f"scripted:{path}",
                              surface="chat", registry=registry).turn_id
    finally:
        engine.dispose()


def ended(settings: Settings, turn_id: str, fleet: Fleet) -> dict[str, Any]:
    engine = make_engine(settings.database_url)

    def view() -> dict[str, Any]:
        found = get_turn(engine, "acme", turn_id)
        assert found is not None
        return found

    try:
        result: dict[str, Any] = wait_until(lambda: (v := view())["state"] not in ("running", "queued") and v,
                                            timeout=60, what="the turn to end", show=fleet.logs)
        return result
    finally:
        engine.dispose()


def test_chat_surface__a_write_needing_no_approval__is_a_card_with_no_effect_until_approved_then_once(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet, tmp_path: Path
) -> None:
    # Given a fleet, and a chat-surface turn whose model reads, then credits acme-2
    # (ledger.credit needs no approval of its own)
    fleet = make_fleet(workers=1, concurrency=2, relays=1, reconcile_every=0.3).start()
    path = script(tmp_path / "turn.jsonl", [
        {"tool_calls": [call("c1", "ledger.get_balance", account_id="acme-1")]},
        {"tool_calls": [call("c2", "ledger.credit", account_id="acme-2", amount_cents=500)]},
        {"final": "Done: acme-2 was credited 5.00."},
    ])
    turn_id = chat_turn(settings, path)
    # When the workers run it
    view = ended(settings, turn_id, fleet)
    # Then the turn ended with the card as its answer, written by the server
    assert (view["state"], view["end_reason"], view["surface"]) == ("succeeded", "approval_card", "chat")
    assert "Nothing has been done yet" in view["final_output"] and "Done:" not in view["final_output"]
    [card] = view["steps"][1]["calls"]
    assert (card["status"], card["state"]) == ("pending", "pending_approval")
    # And no effect: the ledger is untouched and the handler never ran, also a while later
    time.sleep(1.5)
    assert ledger.balance("acme-2") == 0
    assert ledger.effects_per_operation() == {}
    assert invocation_count(card["operation_id"]) == 0
    # When a person with the approver role approves the card
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            decided = store.approve(conn, card["approval_id"], approver=APPROVER, registry=registry)
        assert decided.outcome.value == "decided"
    finally:
        engine.dispose()
    # Then a worker runs the write, and it takes effect exactly once
    wait_until(lambda: ledger.effects_per_operation() == {card["operation_id"]: 1}, timeout=60,
               what="the approved write to take effect", show=fleet.logs)
    time.sleep(1.5)
    assert ledger.effects_per_operation() == {card["operation_id"]: 1}
    assert ledger.balance("acme-2") == 500
    assert invocation_count(card["operation_id"]) == 1


def test_chat_surface__outside_the_catalog_and_unlisted_targets__refused_with_no_handler_run(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet, tmp_path: Path
) -> None:
    fleet = make_fleet(workers=1, concurrency=2, relays=1, reconcile_every=0.3).start()
    # Given alice has a pending card from a first chat turn
    first = chat_turn(settings, script(tmp_path / "a.jsonl", [
        {"tool_calls": [call("c1", "ledger.credit", account_id="acme-2", amount_cents=100)]},
    ]))
    [card] = ended(settings, first, fleet)["steps"][0]["calls"]
    assert card["state"] == "pending_approval"
    # When her next turn proposes a tool outside the catalog, her listed card, and an
    # id the server never listed
    assert "ledger.send_notice" not in CHAT_CATALOG
    second = chat_turn(settings, script(tmp_path / "b.jsonl", [
        {"tool_calls": [
            call("n1", "ledger.send_notice", account_id="acme-2", text="hello"),
            call("d1", "test.describe_operation", operation_id=card["operation_id"]),
            call("d2", "test.describe_operation", operation_id="op_0123456789abcdef"),
        ]},
        {"final": "Here is what I found."},
    ]))
    view = ended(settings, second, fleet)
    by_call = {c["call_id"]: c for c in view["steps"][0]["calls"]}
    # Then the tool outside the catalog was refused tool_not_allowed, its handler never run
    assert by_call["n1"]["error"]["code"] == "tool_not_allowed"
    # And the listed card passed, the made-up id was refused target_not_offered
    assert by_call["d1"]["status"] == "succeeded"
    assert by_call["d1"]["output"] == {"operation_id": card["operation_id"]}
    assert by_call["d2"]["error"]["code"] == "target_not_offered"
    assert card["operation_id"] in view["steps"][0]["listed"]
    # And no handler ran for a refused call (no operation was even registered); the
    # listed read ran once
    assert [by_call[c].get("operation_id") for c in ("n1", "d2")] == [None, None]
    assert invocations_of("ledger.send_notice") == 0
    assert invocations_of("test.describe_operation") == 1
    assert invocation_count(by_call["d1"]["operation_id"]) == 1
    assert ledger.effects_per_operation() == {}


def invocations_of(tool_name: str) -> int:
    with default_ledger().reader.connect() as conn:
        return int(conn.execute(
            select(func.count()).select_from(invocations).where(invocations.c.tool_name == tool_name)
        ).scalar_one())
