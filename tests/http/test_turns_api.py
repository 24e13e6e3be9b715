"""`POST /v1/turns` and `GET /v1/turns/{id}` against a live server (uvicorn in a
thread over a private PostgreSQL database). No worker runs here, so a turn stays
as `start_turn` wrote it; tests/fleet/test_fleet_turns_http.py runs one to the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from servekit import Served
from sqlalchemy import func, select

from executor.http.keys import KeyScope
from executor.store.schema import http_idempotency, outbox, turns

P, A, OP, R = KeyScope.PRODUCE, KeyScope.APPROVE, KeyScope.OPERATE, KeyScope.READ
HELLO = {"conversation_id": "conv-1", "message": "What is the balance of acme-1?"}


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status
    assert body["type"] == f"urn:toolfence:problem:{code}"
    return body


def written(served: Served) -> tuple[int, int, int]:
    with served.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (turns, outbox, http_idempotency)
        )


@pytest.fixture
def turning(served_with: Callable[..., Served], script: Path) -> Served:
    """A server whose setting names the scripted driver."""
    return served_with(turn_driver=f"scripted:{script}")


def test_post_turns__produce_key__202_running_turn_with_the_servers_driver_and_keys_identity(
    turning: Served, script: Path
) -> None:
    # Given a produce key of acme/alice
    key = turning.key("acme", "alice", P, roles=("member",))
    # When a turn is posted
    with turning.client(key) as client:
        response = client.post("/v1/turns", json=HELLO)
    # Then it is accepted (202) and running
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["state"] == "running" and answer["turn_id"].startswith("turn_")
    # And the stored turn has the key's identity and the server's driver, with its outbox row
    with turning.engine.connect() as conn:
        row = conn.execute(select(turns).where(turns.c.turn_id == answer["turn_id"])).one()
        queued = conn.execute(select(func.count()).select_from(outbox).where(
            outbox.c.operation_id == answer["turn_id"])).scalar_one()
    assert (row.tenant, row.principal, row.driver) == ("acme", "alice", f"scripted:{script}")
    assert json.loads(row.context)["roles"] == ["member"]
    assert queued == 1
    # And GET shows it, with no step yet (no worker runs here)
    with turning.client(key) as client:
        view = client.get(f"/v1/turns/{answer['turn_id']}").json()
    assert (view["state"], view["terminal"], view["steps"], view["principal"]) == (
        "running", False, [], "alice"
    )


def test_post_turns__no_driver_on_the_server__503_turns_not_configured_and_nothing_written(
    served: Served,
) -> None:
    # Given a server with no TOOLFENCE_TURN_DRIVER
    key = served.key("acme", "alice", P)
    before = written(served)
    # When a turn is posted
    with served.client(key) as client:
        response = client.post("/v1/turns", json=HELLO)
    # Then a clear problem, not a 500, and nothing was written
    assert_problem(response, 503, "turns_not_configured")
    assert written(served) == before


def test_post_turns__second_turn_of_the_same_user__409_turn_in_progress(turning: Served) -> None:
    # Given alice has a running turn
    key = turning.key("acme", "alice", P)
    with turning.client(key) as client:
        assert client.post("/v1/turns", json=HELLO).status_code == 202
        before = written(turning)
        # When she posts another (another conversation: the scope is the principal)
        second = client.post("/v1/turns", json={**HELLO, "conversation_id": "conv-2"})
    # Then turn_in_progress, and nothing more was written
    assert_problem(second, 409, "turn_in_progress")
    assert written(turning) == before
    # And another principal of the tenant is not held up
    with turning.client(turning.key("acme", "bob", P)) as client:
        assert client.post("/v1/turns", json=HELLO).status_code == 202


def test_post_turns__when_busy_queue__second_turn_202_queued(
    served_with: Callable[..., Served], script: Path
) -> None:
    # Given a server whose when-busy setting queues, and alice's running turn
    server = served_with(turn_driver=f"scripted:{script}", turn_when_busy="queue")
    with server.client(server.key("acme", "alice", P)) as client:
        first = client.post("/v1/turns", json=HELLO)
        # When she posts a second
        second = client.post("/v1/turns", json=HELLO)
    # Then it is accepted, queued behind the first
    assert (first.json()["state"], second.status_code, second.json()["state"]) == ("running", 202, "queued")


def test_post_turns__idempotency_key_retried__same_turn_and_nothing_new(turning: Served) -> None:
    # Given a turn posted with an Idempotency-Key
    key = turning.key("acme", "alice", P)
    headers = {"Idempotency-Key": "turn-17"}
    with turning.client(key) as client:
        first = client.post("/v1/turns", json=HELLO, headers=headers)
        before = written(turning)
        # When the same POST is retried (key order changed: the same canonical body)
        again = client.post("/v1/turns", json=dict(reversed(list(HELLO.items()))), headers=headers)
    # Then the same turn is answered, marked replayed, and nothing new was written
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert written(turning) == before


def test_post_turns__idempotency_key_with_another_body_or_endpoint__idempotency_conflict(
    turning: Served,
) -> None:
    # Given a turn posted with an Idempotency-Key
    key = turning.key("acme", "alice", P)
    headers = {"Idempotency-Key": "k-1"}
    with turning.client(key) as client:
        assert client.post("/v1/turns", json=HELLO, headers=headers).status_code == 202
        before = written(turning)
        # When the key is used with another message, or for a batch of calls
        other = client.post("/v1/turns", json={**HELLO, "message": "something else"}, headers=headers)
        batch = client.post("/v1/requests", headers=headers, json={"calls": [{
            "call_id": "c1", "tool_name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}]})
    # Then both are idempotency_conflict, and nothing was written
    assert_problem(other, 409, "idempotency_conflict")
    assert_problem(batch, 409, "idempotency_conflict")
    assert written(turning) == before


TURN_AUTH_TABLE: list[tuple[str, str, str, str, dict[str, Any] | None, int, str]] = [
    ("no key", "none", "POST", "/v1/turns", HELLO, 401, "unauthenticated"),
    ("no key, read", "none", "GET", "{turn}", None, 401, "unauthenticated"),
    ("read key posts", "acme_read", "POST", "/v1/turns", HELLO, 403, "permission_denied"),
    ("approve key posts", "acme_approver", "POST", "/v1/turns", HELLO, 403, "permission_denied"),
    ("approve key reads", "acme_approver", "GET", "{turn}", None, 403, "permission_denied"),
    ("other tenant's turn", "globex_all", "GET", "{turn}", None, 404, "not_found"),
    ("body names a tenant", "acme_produce", "POST", "/v1/turns", {**HELLO, "tenant": "globex"},
     400, "identity_in_body"),
    ("body names roles", "acme_produce", "POST", "/v1/turns", {**HELLO, "roles": ["admin"]},
     400, "identity_in_body"),
    ("body names a driver", "acme_produce", "POST", "/v1/turns",
     {**HELLO, "driver": "scripted:/etc/passwd"}, 400, "invalid_request"),
    ("body names max_steps", "acme_produce", "POST", "/v1/turns", {**HELLO, "max_steps": 1000},
     400, "invalid_request"),
    ("body without message", "acme_produce", "POST", "/v1/turns", {"conversation_id": "c"},
     422, "invalid_request"),
]


@pytest.mark.parametrize(
    ("case", "key", "method", "path", "body", "status", "code"),
    TURN_AUTH_TABLE,
    ids=[row[0] for row in TURN_AUTH_TABLE],
)
def test_turn_auth_table__each_case__its_status_and_code(
    turning: Served,
    case: str,
    key: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    status: int,
    code: str,
) -> None:
    # Given acme/alice's running turn, and keys of every kind
    keys = {
        "none": None,
        "acme_read": turning.key("acme", "alice", R),
        "acme_produce": turning.key("acme", "carl", P),
        "acme_approver": turning.key("acme", "carol", A, roles=("approver",)),
        "globex_all": turning.key("globex", "gina", P, A, OP, R, roles=("approver", "member")),
    }
    with turning.client(turning.key("acme", "alice", P)) as client:
        turn_id = client.post("/v1/turns", json=HELLO).json()["turn_id"]
    before = written(turning)
    # When the case's request is sent (and the same for a turn id that does not exist)
    with turning.client(keys[key]) as client:
        response = client.request(method, path.format(turn=f"/v1/turns/{turn_id}"), json=body)
        nowhere = client.request(method, path.format(turn=f"/v1/turns/turn_{'0' * 32}"), json=body)
    # Then it gets its status and stable code, and nothing was written
    problem = assert_problem(response, status, code)
    if status == 404:
        # Another tenant's turn is answered exactly like one that does not exist
        assert problem | {"instance": ""} == nowhere.json() | {"instance": ""}
    if case == "body names a driver":
        assert [(e["path"], e["code"]) for e in problem["errors"]] == [("/driver", "server_setting")]
    assert written(turning) == before


def test_get_turn__wait_on_a_running_turn__answers_at_the_bound(turning: Served) -> None:
    # Given a running turn that nothing runs (no worker here)
    key = turning.key("acme", "alice", P)
    with turning.client(key) as client:
        turn_id = client.post("/v1/turns", json=HELLO).json()["turn_id"]
        # When it is read with wait=1
        began = time.monotonic()
        view = client.get(f"/v1/turns/{turn_id}", params={"wait": 1}).json()
        waited = time.monotonic() - began
        # Then the answer comes at the bound, still running; and a wait above 30 is refused
        too_long = client.get(f"/v1/turns/{turn_id}", params={"wait": 31})
    assert view["state"] == "running" and 0.9 <= waited < 5
    assert_problem(too_long, 422, "invalid_request")
