"""The console's forms over HTTP (no browser): sign-in rules, CSRF, the approver
policy's refusal shown on the page, sessions ending with their key, tenant scoping.
The browser test (tests/fleet/test_http_console.py) drives the same pages in Chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from servekit import Served

from executor.http.keys import KeyScope
from executor.store.api_keys import revoke_api_key
from ledger import tools as ledger_tools
from tests.netkit import REFUSED_PASSWORD, Directory

A, OP, P = KeyScope.APPROVE, KeyScope.OPERATE, KeyScope.PRODUCE


def sign_in(client: httpx.Client, key: str) -> httpx.Response:
    """Sign in as a browser does: the form (its token and pre-session cookie), then the POST."""
    form = client.get("/console/login")
    return client.post("/console/login", data={"key": key, "csrf": csrf_of(form.text)})


@contextmanager
def signed_in(served: Served, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        answer = sign_in(client, key)
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/console/approvals", answer.headers["location"]
        yield client


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "every page with a form carries a CSRF token"
    return found.group(1)


def digest_of(page: str) -> str:
    """The impact digest an approve form carries (the impact the page showed)."""
    found = re.search(r'name="impact_digest" value="([0-9a-f]{32})"', page)
    assert found, "every approve form carries the digest of the impact it shows"
    return found.group(1)


def pending_transfer(served: Served) -> dict[str, str]:
    key = served.key("acme", "alice", P)
    with served.client(key) as client:
        [call] = client.post(
            "/v1/requests",
            json={
                "calls": [
                    {
                        "call_id": "t1",
                        "tool_name": "ledger.transfer",
                        "arguments": json.dumps(
                            {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 800_000}
                        ),
                    }
                ]
            },
        ).json()["calls"]
    return call


def test_login__key_without_approve_or_operate__refused(served: Served) -> None:
    # Given a produce-only key, a wrong key; when each signs in
    with httpx.Client(base_url=served.url) as client:
        produce = sign_in(client, served.key("acme", "alice", P))
        wrong = sign_in(client, "tfk_0123456789abcdef_nope")
        page = client.get("/console/approvals")
    # Then neither gets a session, and the pages send them to sign in
    assert produce.headers["location"] == "/console/login?refused=scope"
    assert wrong.headers["location"] == "/console/login?refused=invalid"
    assert "set-cookie" not in produce.headers
    assert page.status_code == 303 and page.headers["location"] == "/console/login"


def test_approve_form__requester_decides_own_call__policy_refusal_shown_and_audited(served: Served) -> None:
    # Given alice's transfer, and alice signed in with an approve key of her own
    call = pending_transfer(served)
    with signed_in(served, served.key("acme", "alice", A, roles=("approver",))) as alice:
        page = alice.get("/console/approvals").text
        assert "move 8000.00 from acme-1 to acme-2" in page
        # When she approves it through the form
        answer = alice.post(
            f"/console/approvals/{call['approval_id']}/approve",
            data={"csrf": csrf_of(page), "impact_digest": digest_of(page)},
            follow_redirects=True,
        )
    # Then the page shows the approver policy's refusal, and the approval is still pending
    assert "The approver policy refused you: you may not decide your own call" in answer.text
    assert call["approval_id"] in answer.text
    carol = served.key("acme", "carol", KeyScope.READ)
    with served.client(carol) as client:
        record = client.get(f"/v1/operations/{call['operation_id']}").json()
    assert record["state"] == "pending_approval"
    assert [(e["decision"], e["actor"]) for e in record["audit"] if e["actor"]] == [
        ("approver_not_allowed", "alice")
    ]


def test_approve_form__role_directory_down__try_again_shown_and_nothing_audited(
    served: Served, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    # Given alice's transfer, and a role resolver whose directory refuses connections
    call = pending_transfer(served)
    directory = Directory(up_url=pg_url, up=False)
    monkeypatch.setattr(ledger_tools.registry, "role_resolver", directory.roles)
    with signed_in(served, served.key("acme", "bob", A, roles=("approver",))) as bob:
        page = bob.get("/console/approvals").text
        # When bob approves it through the form
        answer = bob.post(
            f"/console/approvals/{call['approval_id']}/approve",
            data={"csrf": csrf_of(page), "impact_digest": digest_of(page)}, follow_redirects=True,
        )
    directory.dispose()
    # Then the page says to try again, and the approval is pending with nothing audited
    assert "could not be checked just now; it stays pending, try again" in answer.text
    assert REFUSED_PASSWORD not in answer.text
    with served.client(served.key("acme", "carol", KeyScope.READ)) as client:
        record = client.get(f"/v1/operations/{call['operation_id']}").json()
    assert record["state"] == "pending_approval"
    assert [e["actor"] for e in record["audit"] if e["actor"]] == []


def test_forms__without_the_csrf_token__change_nothing(served: Served) -> None:
    call = pending_transfer(served)
    with signed_in(served, served.key("acme", "carol", A, roles=("approver",))) as carol:
        forged = carol.post(f"/console/approvals/{call['approval_id']}/approve", data={"csrf": "x" * 40})
        missing = carol.post(f"/console/approvals/{call['approval_id']}/deny", data={"reason": "no"})
        still = carol.get("/console/approvals").text
    assert forged.headers["location"] == "/console/approvals?refused=csrf"
    assert missing.headers["location"] == "/console/approvals?refused=csrf"
    assert call["approval_id"] in still


def test_session__key_revoked__signed_out_at_once(served: Served) -> None:
    key = served.key("acme", "carol", A, roles=("approver",))
    with signed_in(served, key) as carol:
        assert carol.get("/console/approvals").status_code == 200
        with served.engine.begin() as conn:
            assert revoke_api_key(conn, key.split("_")[1])
        after = carol.get("/console/approvals")
    assert after.status_code == 303 and after.headers["location"] == "/console/login?refused=expired"


def test_pages__another_tenants_items__neither_listed_nor_shown(served: Served) -> None:
    call = pending_transfer(served)
    with signed_in(served, served.key("globex", "gina", A, OP, roles=("approver",))) as gina:
        approvals = gina.get("/console/approvals").text
        operation = gina.get(f"/console/operations/{call['operation_id']}")
        decided = gina.post(
            f"/console/approvals/{call['approval_id']}/approve",
            data={"csrf": csrf_of(approvals), "impact_digest": "0" * 32},
        )
    assert "Nothing is waiting for an approval" in approvals and call["approval_id"] not in approvals
    assert operation.status_code == 404 and "ledger.transfer" not in operation.text
    assert decided.headers["location"] == "/console/approvals?refused=not_found"


def test_pages__security_headers_and_cookie_flags(served: Served) -> None:
    with httpx.Client(base_url=served.url) as client:
        answer = sign_in(client, served.key("acme", "carol", OP))
        page = client.get("/console/pending")
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert page.headers["cache-control"] == "no-store"
