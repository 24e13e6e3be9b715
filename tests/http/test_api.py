"""The HTTP API of `toolfence serve` against a real uvicorn server and PostgreSQL.

Identity from the key, tenant isolation (404), problem+json with stable codes,
Idempotency-Key, approvals decided by the key's principal under the tool's
approver policy, the reconciliation queue, size caps and rate limits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from servekit import Served
from sqlalchemy import func, select

from executor import store
from executor.http.keys import KeyScope
from executor.http.server import HttpSettings
from executor.providers import SURFACES, encode_tool_name
from executor.store.schema import calls, operations, outbox
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger
from tests.netkit import REFUSED_PASSWORD, Directory, refused_database_url

P, A, OP, R = KeyScope.PRODUCE, KeyScope.APPROVE, KeyScope.OPERATE, KeyScope.READ


def balance(call_id: str, account: str = "acme-1") -> dict[str, Any]:
    return {"call_id": call_id, "tool_name": "ledger.get_balance", "arguments": {"account_id": account}}


def transfer(call_id: str, cents: int, source: str = "acme-1", target: str = "acme-2") -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool_name": "ledger.transfer",
        "arguments": json.dumps({"source_account": source, "target_account": target, "amount_cents": cents}),
    }


def notice(call_id: str) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool_name": "ledger.send_notice",
        "arguments": {"account_id": "acme-1", "text": "hello"},
    }


def wire_name(tool: str, surface: str = "anthropic") -> str:
    """The tool's name as the surface declares it to the model (escaped when needed)."""
    return encode_tool_name(tool, SURFACES[surface].name_rule)


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status
    assert body["type"] == f"urn:toolfence:problem:{code}"
    return body


def counts(served: Served) -> tuple[int, int, int]:
    with served.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (calls, operations, outbox)
        )


def to_reconciliation_pending(served: Served, operation_id: str) -> None:
    """What a worker does when an unsafe write's outcome is lost: reserve, then mark unknown."""
    with served.engine.begin() as conn:
        reservation = store.reserve(conn, operation_id, "owner-test", 30.0)
        assert reservation is not None
        assert store.mark_unknown(
            conn, operation_id, reservation.generation, owner_token="owner-test", reason="worker lost"
        )


# ------------------------------------------------------------------ producing


def test_post_requests__neutral_batch__202_with_operation_ids_and_rejected_results(served: Served) -> None:
    # Given a produce key of acme
    key = served.key("acme", "alice", P)
    # When a batch with a read, an approval-needing transfer and an unknown tool is posted
    with served.client(key) as client:
        response = client.post(
            "/v1/requests",
            json={
                "calls": [
                    balance("c1"),
                    transfer("c2", 500_000),
                    {"call_id": "c3", "tool_name": "nope", "arguments": "{}"},
                ]
            },
        )
    # Then it is admitted and enqueued (202): operation ids, the pending approval's impact,
    # and the rejected call's terminal result, in proposal order
    assert response.status_code == 202, response.text
    body = response.json()
    assert [c["call_id"] for c in body["calls"]] == ["c1", "c2", "c3"]
    read, pay, unknown = body["calls"]
    assert (read["status"], read["state"]) == ("pending", "queued") and read["operation_id"]
    assert pay["state"] == "pending_approval" and pay["impact"]["amount_cents"] == 500_000
    assert (unknown["status"], unknown["error"]["code"]) == ("failed_terminal", "unknown_tool")
    # And the operations exist in acme's request, with outbox rows for the runnable one only
    with served.engine.connect() as conn:
        rows = conn.execute(select(operations).where(operations.c.request_id == body["request_id"])).all()
    assert {(r.tenant, r.call_id, r.state) for r in rows} == {
        ("acme", "c1", "queued"),
        ("acme", "c2", "pending_approval"),
    }
    assert {json.loads(r.context)["principal"] for r in rows} == {"alice"}


def test_post_requests__provider_envelope__calls_read_by_that_surface(served: Served) -> None:
    # Given an Anthropic message proposing one tool_use
    key = served.key("acme", "alice", P)
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "stop_reason": "tool_use",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": wire_name("ledger.get_balance"),
                "input": {"account_id": "acme-1"},
            }
        ],
    }
    # When it is posted with `provider` named
    with served.client(key) as client:
        response = client.post("/v1/requests", json={"provider": "anthropic", "response": message})
        # Then its call is admitted under the tool's registered name
        assert response.status_code == 202, response.text
        [call] = response.json()["calls"]
        assert (call["call_id"], call["tool_name"], call["state"]) == (
            "toolu_1",
            "ledger.get_balance",
            "queued",
        )
        # And the results read back in the Anthropic shape
        shaped = client.get(f"/v1/requests/{response.json()['request_id']}", params={"provider": "anthropic"})
    [user_message] = shaped.json()["results"]
    assert user_message["role"] == "user"
    assert [b["tool_use_id"] for b in user_message["content"]] == ["toolu_1"]


def test_post_requests__idempotency_key_retried__same_answer_and_nothing_new(served: Served) -> None:
    # Given a POST with an Idempotency-Key that was answered
    key = served.key("acme", "alice", P)
    body = {"calls": [balance("c1"), transfer("c2", 100)]}
    with served.client(key) as client:
        first = client.post("/v1/requests", json=body, headers={"Idempotency-Key": "order-17"})
        assert first.status_code == 202
        before = counts(served)
        # When it is retried with the same key and body (keys in another order, other spacing)
        retried = client.post(
            "/v1/requests",
            content=json.dumps({"calls": [{**c} for c in body["calls"]]}, indent=2),
            headers={"Idempotency-Key": "order-17", "Content-Type": "application/json"},
        )
    # Then the same request and operations are answered, marked as a replay, and nothing is written
    assert retried.status_code == 202
    assert retried.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert retried.json()["request_id"] == first.json()["request_id"]
    ops = [(c["call_id"], c["operation_id"]) for c in first.json()["calls"]]
    assert [(c["call_id"], c["operation_id"]) for c in retried.json()["calls"]] == ops
    assert counts(served) == before


def test_post_requests__idempotency_key_with_another_body__idempotency_conflict(served: Served) -> None:
    # Given a key already used for one batch
    key = served.key("acme", "alice", P)
    with served.client(key) as client:
        assert (
            client.post(
                "/v1/requests", json={"calls": [balance("c1")]}, headers={"Idempotency-Key": "k-1"}
            ).status_code
            == 202
        )
        before = counts(served)
        # When another batch comes with the same key
        response = client.post(
            "/v1/requests", json={"calls": [balance("c1", "acme-2")]}, headers={"Idempotency-Key": "k-1"}
        )
    # Then it is refused as a conflict and nothing is written
    assert_problem(response, 409, "idempotency_conflict")
    assert counts(served) == before


def test_post_requests__ledger_database_down__503_nothing_recorded_then_same_key_admits(
    served: Served, book: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the ledger's database, which the tools' access rule reads, refuses connections
    down = Ledger(refused_database_url("ledger"))
    monkeypatch.setattr(ledger_service, "_default", down)
    key = served.key("acme", "alice", P)
    body = {"calls": [balance("c1"), transfer("c2", 100)]}
    before = counts(served)
    with served.client(key) as client:
        refused = client.post("/v1/requests", json=body, headers={"Idempotency-Key": "order-down"})
        # Then the server says try again, names the tool, and records nothing (the key's claim neither)
        problem = assert_problem(refused, 503, "upstream_unavailable")
        assert refused.headers["Retry-After"] == "1"
        assert "ledger.get_balance" in problem["detail"]
        assert REFUSED_PASSWORD not in refused.text and "127.0.0.1" not in refused.text
        assert counts(served) == before
        # When the ledger answers again and the same request is sent with the same key
        monkeypatch.setattr(ledger_service, "_default", book)
        again = client.post("/v1/requests", json=body, headers={"Idempotency-Key": "order-down"})
    down.engine.dispose()
    # Then it is admitted as a new request, not replayed from a stored refusal
    assert again.status_code == 202, again.text
    assert "Idempotent-Replayed" not in again.headers
    assert [c["status"] for c in again.json()["calls"]] == ["pending", "pending"]


def test_post_requests__same_idempotency_key_of_two_principals__two_requests(served: Served) -> None:
    # Given two principals of one tenant using the same Idempotency-Key
    alice, bob = served.key("acme", "alice", P), served.key("acme", "bob", P)
    body = {"calls": [balance("c1")]}
    # When each posts
    with served.client(alice) as a, served.client(bob) as b:
        first = a.post("/v1/requests", json=body, headers={"Idempotency-Key": "same"})
        second = b.post("/v1/requests", json=body, headers={"Idempotency-Key": "same"})
    # Then each gets its own request (neither replays the other's)
    assert first.status_code == second.status_code == 202
    assert first.json()["request_id"] != second.json()["request_id"]
    assert "Idempotent-Replayed" not in second.headers


def test_get_request__wait__long_polls_until_settled_or_bound(served: Served) -> None:
    # Given a request whose only call waits for an approval (settled: nothing changes without a person)
    key = served.key("acme", "alice", P)
    with served.client(key) as client:
        request_id = client.post("/v1/requests", json={"calls": [transfer("c1", 600_000)]}).json()[
            "request_id"
        ]
        # When it is read with ?wait=5
        started = time.monotonic()
        settled = client.get(f"/v1/requests/{request_id}", params={"wait": 5})
        settled_after = time.monotonic() - started
        # And a request with a queued read (no worker here) is read with ?wait=1
        queued_id = client.post("/v1/requests", json={"calls": [balance("c1")]}).json()["request_id"]
        started = time.monotonic()
        waited = client.get(f"/v1/requests/{queued_id}", params={"wait": 1})
        waited_after = time.monotonic() - started
        over = client.get(f"/v1/requests/{queued_id}", params={"wait": 31})
    # Then the settled one answers at once, the queued one after the bound, and a longer wait is refused
    assert settled.json()["settled"] is True and settled_after < 2
    assert waited.json()["settled"] is False and 0.9 <= waited_after < 4
    assert_problem(over, 422, "invalid_request")


# ------------------------------------------------------------------ identity and scopes


@pytest.fixture
def acme_world(served: Served) -> dict[str, str]:
    """acme's request with a pending transfer and a reconciliation_pending notice."""
    key = served.key("acme", "alice", P, R)
    with served.client(key) as client:
        body = client.post("/v1/requests", json={"calls": [transfer("c1", 700_000)]}).json()
        # Its own request: a write waits for the earlier writes of its request.
        [note] = client.post("/v1/requests", json={"calls": [notice("n1")]}).json()["calls"]
    [pay] = body["calls"]
    to_reconciliation_pending(served, note["operation_id"])
    return {
        "request": body["request_id"],
        "approval": pay["approval_id"],
        "operation": pay["operation_id"],
        "pending": note["operation_id"],
    }


AUTH_TABLE: list[tuple[str, str, str, Callable[[dict[str, str]], str], dict[str, Any] | None, int, str]] = [
    # (case, key, method, path(world), json body, status, code)
    ("no key", "none", "GET", lambda w: f"/v1/requests/{w['request']}", None, 401, "unauthenticated"),
    ("malformed key", "garbage", "GET", lambda w: "/v1/approvals", None, 401, "unauthenticated"),
    ("wrong secret", "wrong", "GET", lambda w: "/v1/approvals", None, 401, "unauthenticated"),
    ("revoked key", "revoked", "GET", lambda w: f"/v1/requests/{w['request']}", None, 401, "unauthenticated"),
    (
        "read key posts",
        "acme_read",
        "POST",
        lambda w: "/v1/requests",
        {"calls": [balance("x")]},
        403,
        "permission_denied",
    ),
    (
        "produce key approves",
        "acme_produce",
        "POST",
        lambda w: f"/v1/approvals/{w['approval']}/approve",
        None,
        403,
        "permission_denied",
    ),
    (
        "approve key resolves",
        "acme_approver",
        "POST",
        lambda w: f"/v1/operations/{w['pending']}/resolve",
        {"outcome": "failed"},
        403,
        "permission_denied",
    ),
    (
        "other tenant's request",
        "globex_all",
        "GET",
        lambda w: f"/v1/requests/{w['request']}",
        None,
        404,
        "not_found",
    ),
    (
        "other tenant's operation",
        "globex_all",
        "GET",
        lambda w: f"/v1/operations/{w['operation']}",
        None,
        404,
        "not_found",
    ),
    (
        "other tenant's approval",
        "globex_all",
        "POST",
        lambda w: f"/v1/approvals/{w['approval']}/approve",
        None,
        404,
        "not_found",
    ),
    (
        "other tenant's pending op",
        "globex_all",
        "POST",
        lambda w: f"/v1/operations/{w['pending']}/resolve",
        {"outcome": "failed"},
        404,
        "not_found",
    ),
    (
        "body names a tenant",
        "acme_produce",
        "POST",
        lambda w: "/v1/requests",
        {"tenant": "globex", "calls": [balance("x")]},
        400,
        "identity_in_body",
    ),
    (
        "call names a principal",
        "acme_produce",
        "POST",
        lambda w: "/v1/requests",
        {"calls": [{**balance("x"), "principal": "root"}]},
        400,
        "identity_in_body",
    ),
    (
        "decision names roles",
        "acme_approver",
        "POST",
        lambda w: f"/v1/approvals/{w['approval']}/approve",
        {"roles": ["approver"]},
        400,
        "identity_in_body",
    ),
]


@pytest.mark.parametrize(
    ("case", "key", "method", "path", "body", "status", "code"),
    AUTH_TABLE,
    ids=[row[0] for row in AUTH_TABLE],
)
def test_auth_table__each_case__its_status_and_code(
    served: Served,
    acme_world: dict[str, str],
    case: str,
    key: str,
    method: str,
    path: Callable[[dict[str, str]], str],
    body: dict[str, Any] | None,
    status: int,
    code: str,
) -> None:
    # Given keys of every kind
    revoked = served.key("acme", "alice", P, R)
    with served.engine.begin() as conn:
        from executor.store.api_keys import revoke_api_key

        assert revoke_api_key(conn, revoked.split("_")[1])
    keys = {
        "none": None,
        "garbage": "not-a-key",
        "revoked": revoked,
        "wrong": served.key("acme", "alice", R)[:-4] + "AAAA",
        "acme_read": served.key("acme", "alice", R),
        "acme_produce": served.key("acme", "alice", P),
        "acme_approver": served.key("acme", "carol", A, roles=("approver",)),
        "globex_all": served.key("globex", "gina", P, A, OP, R, roles=("approver", "member")),
    }
    before = counts(served)
    absent = {name: value[:4] + "0" * (len(value) - 4) for name, value in acme_world.items()}
    # When the case's request is sent (and, for comparison, the same with ids that do not exist)
    with served.client(keys[key]) as client:
        response = client.request(method, path(acme_world), json=body)
        nowhere = client.request(method, path(absent), json=body)
    # Then it is answered with its status and stable code, and nothing was written
    problem = assert_problem(response, status, code)
    if status == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")
    if status == 404:
        # Another tenant's id is answered exactly like one that does not exist
        assert problem | {"instance": ""} == nowhere.json() | {"instance": ""}
    assert counts(served) == before


def test_lists__another_tenants_items__never_listed(served: Served, acme_world: dict[str, str]) -> None:
    # Given acme's pending approval and pending operation; when globex lists both queues
    globex = served.key("globex", "gina", A, OP, roles=("approver",))
    acme = served.key("acme", "carol", A, OP, roles=("approver",))
    with served.client(globex) as g, served.client(acme) as a:
        theirs = (g.get("/v1/approvals").json(), g.get("/v1/pending").json())
        ours = (a.get("/v1/approvals").json(), a.get("/v1/pending").json())
    # Then globex sees neither, and acme sees both
    assert theirs == ({"approvals": []}, {"operations": []})
    assert [x["approval_id"] for x in ours[0]["approvals"]] == [acme_world["approval"]]
    assert [x["operation_id"] for x in ours[1]["operations"]] == [acme_world["pending"]]
    assert ours[0]["approvals"][0]["resources"] == ["account:acme-1", "account:acme-2"]


# ------------------------------------------------------------------ approvals and resolutions


def test_approve__approver_key__audit_names_the_keys_principal(
    served: Served, acme_world: dict[str, str]
) -> None:
    # Given an approver of acme, and the requester herself
    carol = served.key("acme", "carol", A, roles=("approver",))
    alice = served.key("acme", "alice", A, roles=("approver",))
    with served.client(alice) as client:
        # When the requester tries to approve her own transfer
        refused = client.post(f"/v1/approvals/{acme_world['approval']}/approve", json={})
    with served.client(carol) as client:
        # And then carol approves it (without a digest: decided on the impact as it is now)
        [shown] = client.get("/v1/approvals").json()["approvals"]
        approved = client.post(f"/v1/approvals/{acme_world['approval']}/approve")
        again = client.post(f"/v1/approvals/{acme_world['approval']}/approve")
        record = client.get(f"/v1/operations/{acme_world['operation']}").json()
    # Then the requester is refused by the approver policy (audited, still pending), carol wins once
    assert assert_problem(refused, 403, "approver_not_allowed")["errors"][0]["code"] == "self_approval"
    assert approved.status_code == 200, approved.text
    assert approved.json() | {"approval_id": None} == {
        "approval_id": None,
        "decision": "approved",
        "decided_by": "carol",
        "operation_id": acme_world["operation"],
        "state": "queued",
        "impact_digest": shown["impact_digest"],
    }
    assert_problem(again, 409, "not_pending")
    # And the audit trail names who tried and who decided, from their keys
    assert [(e["decision"], e["actor"]) for e in record["audit"] if e["actor"]] == [
        ("approver_not_allowed", "alice"),
        ("approved", "carol"),
    ]


def test_approve__directory_of_roles_down__503_stays_pending_nothing_audited_then_approves(
    served: Served, acme_world: dict[str, str], monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    # Given the application's role resolver asks a directory that refuses connections
    directory = Directory(up_url=pg_url, up=False)
    monkeypatch.setattr(ledger_tools.registry, "role_resolver", directory.roles)
    carol = served.key("acme", "carol", A, R, roles=("approver",))
    with served.client(carol) as client:
        # When carol approves
        refused = client.post(f"/v1/approvals/{acme_world['approval']}/approve")
        before = client.get(f"/v1/operations/{acme_world['operation']}").json()
        # Then 503: her roles could not be checked, the approval stays pending, and
        # nothing was audited (an approver_not_allowed would be false)
        assert_problem(refused, 503, "upstream_unavailable")
        assert refused.headers["Retry-After"] == "1"
        assert "stays pending" in refused.json()["detail"] and REFUSED_PASSWORD not in refused.text
        assert before["state"] == "pending_approval"
        assert [e["decision"] for e in before["audit"] if e["actor"]] == []
        # When the directory answers again
        directory.up = True
        approved = client.post(f"/v1/approvals/{acme_world['approval']}/approve")
    directory.dispose()
    # Then the same approval goes through
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "queued"


def test_deny__with_reason__operation_ends_approval_denied(
    served: Served, acme_world: dict[str, str]
) -> None:
    carol = served.key("acme", "carol", A, R, roles=("approver",))
    with served.client(carol) as client:
        denied = client.post(f"/v1/approvals/{acme_world['approval']}/deny", json={"reason": "too much"})
        request = client.get(f"/v1/requests/{acme_world['request']}").json()
    assert denied.json()["state"] == "failed_terminal"
    assert request["calls"][0]["error"]["code"] == "approval_denied"


def test_resolve__operate_key__pending_operation_settled_with_receipt(
    served: Served, acme_world: dict[str, str]
) -> None:
    # Given an operator of acme and an unsafe write whose outcome is unknown
    olga = served.key("acme", "olga", OP, R)
    with served.client(olga) as client:
        [pending] = client.get("/v1/pending").json()["operations"]
        # When succeeded is asked without a reference, then with one
        missing = client.post(
            f"/v1/operations/{acme_world['pending']}/resolve", json={"outcome": "succeeded"}
        )
        resolved = client.post(
            f"/v1/operations/{acme_world['pending']}/resolve",
            json={"outcome": "succeeded", "reference": "notice-42", "note": "checked"},
        )
        twice = client.post(f"/v1/operations/{acme_world['pending']}/resolve", json={"outcome": "failed"})
        record = client.get(f"/v1/operations/{acme_world['pending']}").json()
    # Then the queue showed its cause and generation; the resolution needs the reference,
    # is recorded once as olga's, with the reference as its one receipt
    assert (pending["cause"], pending["generation"]) == ("reconciliation_pending", 1)
    # (422: the document's if/then says succeeded needs a reference, decision 0201)
    assert_problem(missing, 422, "invalid_request")
    assert resolved.json() == {
        "operation_id": acme_world["pending"],
        "state": "succeeded",
        "resolved_by": "olga",
    }
    assert_problem(twice, 409, "not_pending")
    assert record["side_effects"] == 1 and record["receipts"][0]["receipt"] == "notice-42"
    assert record["audit"][-1]["decision"] == "resolved_succeeded" and record["audit"][-1]["actor"] == "olga"
    assert [c["call_id"] for c in record["request_calls"]] == ["n1"]


# ------------------------------------------------------------------ bodies, limits, health


def test_post_requests__strict_json__duplicate_keys_and_nan_refused(served: Served) -> None:
    key = served.key("acme", "alice", P)
    with served.client(key) as client:
        duplicate = client.post(
            "/v1/requests",
            content=b'{"calls": [], "calls": []}',
            headers={"Content-Type": "application/json"},
        )
        nan = client.post(
            "/v1/requests",
            content=b'{"calls": [{"call_id": "a", "tool_name": "t", "arguments": {"x": NaN}}]}',
            headers={"Content-Type": "application/json"},
        )
        deep = client.post(
            "/v1/requests", content=b"[" * 100 + b"]" * 100, headers={"Content-Type": "application/json"}
        )
        schema = client.post("/v1/requests", json={"calls": []})
    assert assert_problem(duplicate, 400, "invalid_request")["errors"][0]["code"] == "duplicate_key"
    assert assert_problem(nan, 400, "invalid_request")["errors"][0]["code"] == "non_finite_number"
    assert assert_problem(deep, 400, "invalid_request")["errors"][0]["code"] == "too_deep"
    assert_problem(schema, 422, "invalid_request")


def test_post_requests__body_over_the_cap__413_and_nothing_written(
    served_with: Callable[..., Served],
) -> None:
    served = served_with(HttpSettings(session_secret=b"s" * 32, max_body_bytes=2048, rate_limit="100/minute"))
    key = served.key("acme", "alice", P)
    big = {"calls": [{**balance("c1"), "arguments": {"account_id": "x" * 4096}}]}
    with served.client(key) as client:
        response = client.post("/v1/requests", json=big)

        def chunks() -> Any:
            yield json.dumps(big).encode()

        streamed = client.post("/v1/requests", content=chunks(), headers={"Content-Type": "application/json"})
    assert_problem(response, 413, "request_too_large")
    assert_problem(streamed, 413, "request_too_large")  # no Content-Length: counted as it streams
    assert counts(served) == (0, 0, 0)


def test_rate_limit__over_the_keys_budget__429_with_retry_after(served_with: Callable[..., Served]) -> None:
    served = served_with(HttpSettings(session_secret=b"s" * 32, rate_limit="3/minute"))
    key, other = served.key("acme", "alice", R), served.key("acme", "bob", R)
    with served.client(key) as client, served.client(other) as second:
        answers = [client.get("/v1/approvals") for _ in range(4)]
        others = second.get("/v1/approvals")
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    assert_problem(answers[3], 429, "rate_limited")
    assert 1 <= int(answers[3].headers["Retry-After"]) <= 60
    assert others.status_code == 200  # per key


def test_health_and_ready__migrated_database__ok(served: Served) -> None:
    with served.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz").json()
        unknown = client.get("/v2/nothing")
    assert ready["status"] == "ready" and ready["revision"]
    assert_problem(unknown, 404, "not_found")


def test_post_requests__same_idempotency_key_concurrently__one_request_created(served: Served) -> None:
    # Given six clients retrying one POST with the same Idempotency-Key at the same moment
    from concurrent.futures import ThreadPoolExecutor

    key = served.key("acme", "alice", P)
    body = {"calls": [balance("c1"), transfer("c2", 100)]}

    def post(_: int) -> httpx.Response:
        with served.client(key) as client:
            return client.post("/v1/requests", json=body, headers={"Idempotency-Key": "racing"})

    # When they all post
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(post, range(6)))
    # Then every one is answered with the one request; exactly one created it
    assert [a.status_code for a in answers] == [202] * 6
    assert len({a.json()["request_id"] for a in answers}) == 1
    assert sum("Idempotent-Replayed" not in a.headers for a in answers) == 1
    assert counts(served)[:2] == (2, 2)


def test_sqlite__post_replay_approve_resolve__same_answers_as_postgresql(served_sqlite: Served) -> None:
    # Given the server on SQLite, a producer and an approver/operator of acme
    served = served_sqlite
    alice = served.key("acme", "alice", P)
    carol = served.key("acme", "carol", A, OP, R, roles=("approver",))
    body = {"calls": [transfer("c1", 900_000)]}
    with served.client(alice) as producer, served.client(carol) as person:
        # When a transfer is posted twice under one Idempotency-Key, then approved
        first = producer.post("/v1/requests", json=body, headers={"Idempotency-Key": "sq-1"})
        again = producer.post("/v1/requests", json=body, headers={"Idempotency-Key": "sq-1"})
        conflict = producer.post(
            "/v1/requests", json={"calls": [balance("c1")]}, headers={"Idempotency-Key": "sq-1"}
        )
        [pay] = first.json()["calls"]
        approved = person.post(f"/v1/approvals/{pay['approval_id']}/approve")
        # And an unsafe write with an unknown outcome is resolved
        [note] = producer.post("/v1/requests", json={"calls": [notice("n1")]}).json()["calls"]
        to_reconciliation_pending(served, note["operation_id"])
        resolved = person.post(f"/v1/operations/{note['operation_id']}/resolve", json={"outcome": "failed"})
    # Then each is answered as on PostgreSQL
    assert first.status_code == again.status_code == 202
    assert again.json()["request_id"] == first.json()["request_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert_problem(conflict, 409, "idempotency_conflict")
    assert approved.json()["state"] == "queued" and approved.json()["decided_by"] == "carol"
    assert resolved.json()["state"] == "failed_terminal"


def test_get_request__fifty_long_polls_waiting__other_requests_still_answered_at_once(served: Served) -> None:
    # Given a request that stays unsettled (no worker), and fifty clients long-polling it
    # (more than the threadpool's forty threads)
    from concurrent.futures import ThreadPoolExecutor

    key = served.key("acme", "alice", P, R)
    with served.client(key) as client:
        request_id = client.post("/v1/requests", json={"calls": [balance("c1")]}).json()["request_id"]

    def long_poll(_: int) -> int:
        with served.client(key) as poller:
            # Long enough that a loaded machine (the other test tiers run beside this
            # one) answers the other request before any poll's wait runs out.
            return poller.get(f"/v1/requests/{request_id}", params={"wait": 12}).status_code

    with ThreadPoolExecutor(max_workers=50) as pool:
        polls = [pool.submit(long_poll, i) for i in range(50)]
        time.sleep(1.0)
        # When another request arrives while they all wait
        with served.client(key) as client:
            other = client.get("/v1/approvals")
        # Then it is answered before any of them (the waits hold no thread: had they
        # held the threadpool, it would queue behind polls that answer after 12 s);
        # ordered, not timed, so a busy machine cannot fail it
        answered_first = not any(poll.done() for poll in polls)
        statuses = [p.result() for p in polls]
    assert other.status_code == 200 and answered_first
    # and every poll is answered
    assert statuses == [200] * 50


def test_metrics__responses__counted_by_route_template_and_status(served: Served) -> None:
    # Given the counters before; when a key reads a request that is not there, and a path nothing serves
    from prometheus_client import REGISTRY

    def count(route: str, status: str) -> float:
        return (
            REGISTRY.get_sample_value("toolfence_http_responses_total", {"route": route, "status": status})
            or 0.0
        )

    before = (
        count("/v1/requests/{request_id}", "404"),
        count("unmatched", "404"),
        count("/v1/requests", "401"),
    )
    key = served.key("acme", "alice", R)
    with served.client(key) as client:
        client.get("/v1/requests/req_nowhere")
        client.get("/v2/nothing")
    with served.client() as anonymous:
        anonymous.post("/v1/requests", json={"calls": [balance("c1")]})
    # Then each is counted under its route template (never the id), refusals included.
    # The server counts an answer after its last byte is sent, so the client may read
    # the counters first: wait (bounded) for the last one to land.
    def after() -> list[float]:
        now = (
            count("/v1/requests/{request_id}", "404"),
            count("unmatched", "404"),
            count("/v1/requests", "401"),
        )
        return [a - b for a, b in zip(now, before, strict=True)]

    deadline = time.monotonic() + 10
    while after() != [1.0, 1.0, 1.0] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert after() == [1.0, 1.0, 1.0]
