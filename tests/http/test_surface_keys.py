"""API keys with a turn surface, against a live server (uvicorn in a thread over a
private PostgreSQL database, the ledger's tools with the `chat` and `lookup`
surfaces of tests/surfacekit.py). No worker runs here: what is checked is what
admission and `start_turn` wrote; tests/fleet runs turns to the end.

A key's surface applies to every request made with it (decision 0208): its turns
run under it, and so do the calls it posts to `POST /v1/requests`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from servekit import Served
from sqlalchemy import func, select

from executor.http.keys import KeyScope
from executor.store.schema import api_keys, http_idempotency, operations, outbox, turns
from ledger.service import Ledger
from tests.integration.turnkit import calls, drive, write_script
from tests.surfacekit import CHAT, LOOKUP, OUTSIDE_CHAT, surfaced_registry

P, A, R = KeyScope.PRODUCE, KeyScope.APPROVE, KeyScope.READ
HELLO = {"conversation_id": "conv-1", "message": "Credit acme-2 with 2.50"}


def credit(call_id: str, cents: int = 250) -> dict[str, Any]:
    return {"call_id": call_id, "tool_name": "ledger.credit",
            "arguments": {"account_id": "acme-2", "amount_cents": cents}}


def invoice(call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "tool_name": OUTSIDE_CHAT,
            "arguments": {"account_id": "acme-1", "amount_cents": 100}}


def balance(call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "tool_name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}


def written(served: Served) -> tuple[int, ...]:
    with served.engine.connect() as conn:
        return tuple(
            int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (operations, outbox, turns, http_idempotency)
        )


def stored_turn_surface(served: Served, turn_id: str) -> str | None:
    with served.engine.connect() as conn:
        context = conn.execute(select(turns.c.context).where(turns.c.turn_id == turn_id)).scalar_one()
    surface: str | None = json.loads(context).get("surface")
    return surface


def assert_surface_problem(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert (body["code"], body["errors"]) == (
        "turns_not_configured", [{"path": "", "code": "unknown_surface", "expected": None}]
    )
    # The key's surface name is the server's own configuration: not echoed either.
    assert "gone" not in response.text


@pytest.fixture
def chat_server(served_with: Callable[..., Served], script: Path) -> Served:
    """A server with the surfaced registry, turns on the scripted driver, no default surface."""
    return served_with(registry=surfaced_registry(), turn_driver=f"scripted:{script}")


def test_post_turns__chat_key__the_turn_runs_under_the_keys_surface(chat_server: Served) -> None:
    # Given a produce key of alice made for the chat surface, and one of bob without a surface
    chat_key = chat_server.key("acme", "alice", P, R, surface=CHAT)
    plain_key = chat_server.key("acme", "bob", P, R)
    # When each posts a turn
    with chat_server.client(chat_key) as client:
        started = client.post("/v1/turns", json=HELLO)
        assert started.status_code == 202, started.text
        view = client.get(f"/v1/turns/{started.json()['turn_id']}").json()
    with chat_server.client(plain_key) as client:
        plain = client.post("/v1/turns", json=HELLO).json()
        plain_view = client.get(f"/v1/turns/{plain['turn_id']}").json()
    # Then alice's turn runs under chat (shown and stored with its context), bob's under none
    assert view["surface"] == CHAT
    assert stored_turn_surface(chat_server, view["turn_id"]) == CHAT
    assert plain_view["surface"] is None
    assert stored_turn_surface(chat_server, plain["turn_id"]) is None


def test_post_turns__key_without_surface__the_servers_setting_names_it_and_a_keys_own_wins(
    served_with: Callable[..., Served], script: Path
) -> None:
    # Given a server whose TOOLFENCE_TURN_SURFACE is chat
    server = served_with(registry=surfaced_registry(), turn_driver=f"scripted:{script}", turn_surface=CHAT)
    # When a key without a surface, and one made for `lookup`, each post a turn
    started = {}
    for principal, surface in (("alice", None), ("bob", LOOKUP)):
        with server.client(server.key("acme", principal, P, R, surface=surface)) as client:
            turn_id = client.post("/v1/turns", json=HELLO).json()["turn_id"]
            started[principal] = client.get(f"/v1/turns/{turn_id}").json()["surface"]
    # Then the first runs under the server's surface, the second under its key's
    assert started == {"alice": CHAT, "bob": LOOKUP}


def test_post_requests__chat_key__a_write_waits_for_approval_and_a_tool_outside_the_catalog_is_refused(
    chat_server: Served,
) -> None:
    # Given alice's chat key, and a key of the same identity without a surface
    chat_key = chat_server.key("acme", "alice", P, A, surface=CHAT)
    plain_key = chat_server.key("acme", "alice", P)
    batch = {"calls": [balance("c1"), credit("c2"), invoice("c3")]}
    # When the chat key posts a read, a credit (no approval of its own) and an invoice
    with chat_server.client(chat_key) as client:
        response = client.post("/v1/requests", json=batch)
    # Then the read is queued, the credit waits for a person and the invoice is refused
    assert response.status_code == 202, response.text
    read, write, outside = response.json()["calls"]
    assert (read["status"], read["state"]) == ("pending", "queued")
    assert (write["status"], write["state"]) == ("pending", "pending_approval")
    assert write["impact"] is not None
    assert (outside["status"], outside["error"]["code"]) == ("failed_terminal", "tool_not_allowed")
    # And the stored context names the surface (the worker re-checks on it); no outbox row
    # was written for the card (nothing runs until a person approves)
    with chat_server.engine.connect() as conn:
        row = conn.execute(select(operations).where(operations.c.operation_id == write["operation_id"])).one()
        queued = conn.execute(select(func.count()).select_from(outbox).where(
            outbox.c.operation_id == write["operation_id"])).scalar_one()
    assert (row.state, json.loads(row.context)["surface"], queued) == ("pending_approval", CHAT, 0)
    # When the same batch is posted with the plain key
    with chat_server.client(plain_key) as client:
        plain = client.post("/v1/requests", json=batch).json()["calls"]
    # Then the tools' own policies apply: the credit and the invoice are queued
    assert [c.get("state") for c in plain] == ["queued", "queued", "queued"]
    # When alice approves her own card (the surface's approvers allow it)
    with chat_server.client(chat_key) as client:
        cards = client.get("/v1/approvals").json()["approvals"]
        card = next(c for c in cards if c["operation_id"] == write["operation_id"])
        decided = client.post(f"/v1/approvals/{card['approval_id']}/approve", json={})
    # Then the credit is queued, to run once
    assert decided.status_code == 200, decided.text
    assert (decided.json()["decision"], decided.json()["state"]) == ("approved", "queued")


def test_post_requests__lookup_key__a_write_is_not_offered(chat_server: Served) -> None:
    # Given a key made for the read-only `lookup` surface
    key = chat_server.key("acme", "alice", P, surface=LOOKUP)
    # When it posts a read and a write
    with chat_server.client(key) as client:
        calls = client.post("/v1/requests", json={"calls": [balance("c1"), credit("c2")]}).json()["calls"]
    # Then the read is queued and the write refused before anything runs
    assert calls[0]["state"] == "queued"
    assert (calls[1]["status"], calls[1]["error"]["code"]) == ("failed_terminal", "tool_not_allowed")


def test_undeclared_key_surface__requests_and_turns__503_and_nothing_written(chat_server: Served) -> None:
    # Given a key whose surface this server's registry does not declare (made for another
    # deployment, or a surface removed since)
    key = chat_server.key("acme", "alice", P, surface="gone")
    before = written(chat_server)
    # When it posts calls (with an Idempotency-Key too) and a turn
    with chat_server.client(key) as client:
        plain = client.post("/v1/requests", json={"calls": [balance("c1")]})
        keyed = client.post(
            "/v1/requests", json={"calls": [balance("c1")]}, headers={"Idempotency-Key": "k-1"}
        )
        turn = client.post("/v1/turns", json=HELLO)
    # Then each is 503 turns_not_configured, and nothing was written, not even the key's claim
    for response in (plain, keyed, turn):
        assert_surface_problem(response)
    assert written(chat_server) == before


def test_undeclared_server_surface__turns_503_and_requests_unaffected(
    served_with: Callable[..., Served], script: Path
) -> None:
    # Given a server whose TOOLFENCE_TURN_SURFACE its registry does not declare
    server = served_with(registry=surfaced_registry(), turn_driver=f"scripted:{script}", turn_surface="gone")
    key = server.key("acme", "alice", P)
    before = written(server)
    with server.client(key) as client:
        # When a key without a surface posts a turn
        turn = client.post("/v1/turns", json=HELLO)
        # Then 503, nothing written
        assert_surface_problem(turn)
        assert written(server) == before
        # And its requests do not take the turns' setting: admitted as before
        assert client.post("/v1/requests", json={"calls": [balance("c1")]}).status_code == 202
    # And a key made for chat still runs its turns under chat
    with server.client(server.key("acme", "bob", P, surface=CHAT)) as client:
        assert client.post("/v1/turns", json=HELLO).status_code == 202


def test_api_key_row__surface_stored_and_bounded(chat_server: Served) -> None:
    # Given a key made for chat
    chat_server.key("acme", "alice", P, surface=CHAT)
    with chat_server.engine.connect() as conn:
        assert conn.execute(select(api_keys.c.surface)).scalars().all() == [CHAT]
    # When a surface name longer than a surface's column is given, or one with a control
    # Then it is refused before the insert (PostgreSQL would abort the transaction)
    for bad in ("x" * 65, "chat\n"):
        with pytest.raises(ValueError, match="surface is not valid"):
            chat_server.key("acme", "bob", P, surface=bad)


def test_chat_turn_run_by_the_fleet__get_shows_its_surface_each_steps_listed_items_and_the_card(
    served_with: Callable[..., Served], book: Ledger, tmp_path: Path
) -> None:
    # Given a chat key, and a scripted model that credits acme-2 (no approval of its own)
    script = write_script(tmp_path / "credit.jsonl", [
        calls("ledger.credit", account_id="acme-2", amount_cents=250), {"final": "Credited."},
    ])
    registry = surfaced_registry()
    server = served_with(registry=registry, turn_driver=f"scripted:{script}")
    key = server.key("acme", "alice", P, R, surface=CHAT)
    with server.client(key) as client:
        turn_id = client.post("/v1/turns", json=HELLO).json()["turn_id"]
    # When the turn job and its operations run (in this process, on PostgreSQL: turnkit.drive)
    drive(server.engine, server.settings, registry, turn_id)
    with server.client(key) as client:
        view = client.get(f"/v1/turns/{turn_id}").json()
    # Then GET shows the surface, the items the step listed, and the credit as a card
    assert view["surface"] == CHAT
    assert view["steps"][0]["listed"] == ["acme-2"]
    assert [c.get("state") for c in view["steps"][0]["calls"]] == ["pending_approval"]
    # And nothing was credited (the card waits for a person)
    assert book.balance("acme-2") == 0
