"""The console's lists and pages over HTTP (no browser): requests, operations and
turns of the key's tenant, filtered, newest first, paged by keyset, with the state
counts; the operation page's record; "Run it again" held to a confirmation.

The browser tests (tests/fleet/test_console_live.py) drive the same pages in
Chromium over a real fleet."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from servekit import Served
from test_api import OP, A, P, balance, notice, to_reconciliation_pending, transfer
from test_console_forms import csrf_of, signed_in

from executor.http.console import lists
from executor.http.console.views import principal_key


def _ids(page: str, attribute: str) -> list[str]:
    return re.findall(rf'<tr {attribute}="([^"]+)"', page)


@pytest.fixture
def world(served: Served) -> dict[str, str]:
    """acme: alice's read + transfer (approval), alice's refused call, bob's notice; globex's read."""
    alice, bob = served.key("acme", "alice", P), served.key("acme", "bob", P)
    gina = served.key("globex", "gina", P)
    with served.client(alice) as client:
        first = client.post("/v1/requests", json={"calls": [balance("b1"), transfer("t1", 600_000)]}).json()
        refused = client.post(
            "/v1/requests", json={"calls": [{"call_id": "x", "tool_name": "nope", "arguments": "{}"}]}
        ).json()
    with served.client(bob) as client:
        sent = client.post("/v1/requests", json={"calls": [notice("n1")]}).json()
    with served.client(gina) as client:
        client.post("/v1/requests", json={"calls": [balance("g1", "globex-1")]})
    return {
        "read": first["calls"][0]["operation_id"], "transfer": first["calls"][1]["operation_id"],
        "first_request": first["request_id"], "refused_request": refused["request_id"],
        "notice": sent["calls"][0]["operation_id"], "notice_request": sent["request_id"],
    }


def test_operations_list__filters_counts_and_tenant(served: Served, world: dict[str, str]) -> None:
    with signed_in(served, served.key("acme", "carol", A, OP, roles=("approver",))) as carol:
        everything = carol.get("/console/operations").text
        waiting = carol.get("/console/operations?state=pending_approval").text
        notices = carol.get("/console/operations?tool=ledger.send_notice").text
        bobs = carol.get(f"/console/operations?principal={principal_key('bob')}").text
        future = carol.get("/console/operations?since=2999-01-01T00:00").text
        past = carol.get("/console/operations?until=2000-01-01T00:00").text
        bogus = carol.get("/console/operations?state=%3Cscript%3E&since=yesterday&principal=CallNow").text
    # Then acme's three operations, newest first; never globex's
    assert _ids(everything, "data-operation-id") == [world["notice"], world["transfer"], world["read"]]
    # And each filter narrows it
    assert _ids(waiting, "data-operation-id") == [world["transfer"]]
    assert _ids(notices, "data-operation-id") == [world["notice"]]
    assert _ids(bobs, "data-operation-id") == [world["notice"]]
    assert _ids(future, "data-operation-id") == [] and "No operation matches" in future
    assert _ids(past, "data-operation-id") == []
    # And the state counts are at the top, under every filter but the state
    counts = dict(re.findall(r'data-state="([a-z_]+)"[^>]*>[a-z_]+ <b>(\d+)</b>', everything))
    assert counts == {"pending_approval": "1", "queued": "2"}
    assert 'all <b>3</b>' in waiting
    # And what cannot be read is ignored and named, never echoed
    assert "Ignored: state, principal, since" in bogus
    assert "<script>" not in bogus and "CallNow" not in bogus
    # And the principal filter offers the tenant's principals (by digest), never a URL's text
    assert f'<option value="{principal_key("bob")}">bob</option>' in everything
    assert len(_ids(bogus, "data-operation-id")) == 3


def test_operations_list__keyset_pages__each_operation_once_newest_first(
    served: Served, world: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given pages of two rows
    monkeypatch.setattr(lists, "PAGE_SIZE", 2)
    seen: list[str] = []
    with signed_in(served, served.key("acme", "carol", OP)) as carol:
        url: str | None = "/console/operations"
        while url is not None:
            page = carol.get(url).text
            seen += _ids(page, "data-operation-id")
            found = re.search(r'<a href="([^"]+)" rel="next"', page)
            url = found.group(1).replace("&amp;", "&") if found else None
            # (a row written while she pages does not shift the next page)
            if len(seen) == 2:
                with served.client(served.key("acme", "alice", P)) as client:
                    client.post("/v1/requests", json={"calls": [balance("late")]})
    assert seen == [world["notice"], world["transfer"], world["read"]]


def test_requests_list__states_tools_and_filters(served: Served, world: dict[str, str]) -> None:
    with signed_in(served, served.key("acme", "carol", OP)) as carol:
        everything = carol.get("/console/requests").text
        by_tool = carol.get("/console/requests?tool=ledger.transfer").text
        by_principal = carol.get(f"/console/requests?principal={principal_key('bob')}").text
        opened = carol.get(f"/console/requests/{world['first_request']}", follow_redirects=False)
    assert _ids(everything, "data-request-id") == [
        world["notice_request"], world["refused_request"], world["first_request"]
    ]
    assert "none admitted" in everything and "pending_approval <b>1</b>" in everything
    assert _ids(by_tool, "data-request-id") == [world["first_request"]]
    assert _ids(by_principal, "data-request-id") == [world["notice_request"]]
    assert opened.status_code == 303 and opened.headers["location"].startswith("/console/operations/op")


def test_turns_list_and_page__a_turn_of_the_tenant(
    served_with: Callable[..., Served], script: Path
) -> None:
    # Given a server that runs turns, and a turn started by alice
    server = served_with(turn_driver=f"scripted:{script}")
    with server.client(server.key("acme", "alice", P)) as client:
        started = client.post("/v1/turns", json={"conversation_id": "conv-1", "message": "hi"}).json()
    with signed_in(server, server.key("acme", "carol", OP)) as carol:
        listed = carol.get("/console/turns").text
        by_state = carol.get("/console/turns?state=succeeded").text
        page = carol.get(f"/console/turns/{started['turn_id']}").text
        other = carol.get("/console/turns/turn_nope")
    assert _ids(listed, "data-turn-id") == [started["turn_id"]] and "conv-1" in listed
    assert _ids(by_state, "data-turn-id") == []
    assert 'data-testid="turn-state">running<' in page and "No step yet" in page
    assert other.status_code == 404


def test_operation_page__record_a_person_needs(served: Served, world: dict[str, str]) -> None:
    with signed_in(served, served.key("acme", "carol", A, OP, roles=("approver",))) as carol:
        page = carol.get(f"/console/operations/{world['transfer']}").text
        denied = carol.post(
            f"/console/approvals/{_approval_of(served, world['transfer'])}/deny",
            data={"csrf": csrf_of(page), "reason": "too large today"},
        )
        after = carol.get(f"/console/operations/{world['transfer']}").text
    assert denied.headers["location"] == "/console/approvals?notice=denied"
    # Then arguments, attempts in words, ISO times, the calls of its request with their states
    assert '&#34;amount_cents&#34;: 600000' in page or '"amount_cents": 600000' in page
    assert 'data-testid="attempts">0 attempts' in page and "(0 attempts)" not in page
    assert re.search(r"<time datetime=\"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\">", page)
    assert "<b>queued</b>" in page and "<b>pending_approval</b>" in page
    # And after the denial: who, when and why, and the error message
    assert 'data-testid="approval-reason">too large today<' in after and "by carol" in after
    assert 'data-testid="error-message">approval denied<' in after


def test_run_again__unsafe_write__needs_the_confirmation(served: Served, world: dict[str, str]) -> None:
    # Given bob's notice (an unsafe write) waiting for a person
    to_reconciliation_pending(served, world["notice"])
    with signed_in(served, served.key("acme", "carol", OP)) as carol:
        page = carol.get("/console/pending").text
        bare = carol.post(
            f"/console/operations/{world['notice']}/resolve",
            data={"csrf": csrf_of(page), "outcome": "requeue"},
        )
        still = carol.get("/console/pending").text
        confirmed = carol.post(
            f"/console/operations/{world['notice']}/resolve",
            data={"csrf": csrf_of(page), "outcome": "requeue", "confirm": "it-did-not-happen"},
        )
    # Then the page warns, and the server refuses a requeue without the confirmation
    assert "is an unsafe write" in page and 'name="confirm"' in page
    assert 'data-testid="age">· waiting ' in page
    assert "&#34;text&#34;: &#34;hello&#34;" in page or '"text": "hello"' in page
    assert bare.headers["location"] == "/console/pending?refused=confirm"
    assert world["notice"] in still
    assert confirmed.headers["location"] == f"/console/operations/{world['notice']}?notice=resolved"


def _approval_of(served: Served, operation_id: str) -> str:
    from executor import store

    with served.engine.connect() as conn:
        record = store.approval_for_operation(conn, operation_id)
    assert record is not None
    return record.approval_id


def test_operations_list__sqlite__principal_and_tool_filters(served_sqlite: Served) -> None:
    # Given the same store on SQLite (the principal is read from the stored context's JSON)
    alice, bob = served_sqlite.key("acme", "alice", P), served_sqlite.key("acme", "bob", P)
    with served_sqlite.client(alice) as client:
        mine = client.post("/v1/requests", json={"calls": [balance("b1")]}).json()["calls"][0]
    with served_sqlite.client(bob) as client:
        theirs = client.post("/v1/requests", json={"calls": [notice("n1")]}).json()["calls"][0]
    with signed_in(served_sqlite, served_sqlite.key("acme", "carol", OP)) as carol:
        by_alice = carol.get(f"/console/operations?principal={principal_key('alice')}").text
        by_tool = carol.get("/console/operations?tool=ledger.send_notice").text
        turns = carol.get("/console/turns?tool=ledger.get_balance").text
        requests = carol.get(f"/console/requests?principal={principal_key('bob')}&state=queued").text
    assert _ids(by_alice, "data-operation-id") == [mine["operation_id"]]
    assert _ids(by_tool, "data-operation-id") == [theirs["operation_id"]]
    assert "No turn matches" in turns
    assert len(_ids(requests, "data-request-id")) == 1


def test_operation_and_pending_pages__secret_shaped_argument__shown_redacted(served: Served) -> None:
    # Given a notice whose text carries something shaped like a secret, its outcome unknown
    secret = "sk-live0123456789abcdefXYZ"
    with served.client(served.key("acme", "alice", P)) as client:
        [call] = client.post("/v1/requests", json={"calls": [{
            "call_id": "n1", "tool_name": "ledger.send_notice",
            "arguments": {"account_id": "acme-1", "text": f"your key is {secret}"},
        }]}).json()["calls"]
    to_reconciliation_pending(served, call["operation_id"])
    with signed_in(served, served.key("acme", "carol", OP)) as carol:
        operation = carol.get(f"/console/operations/{call['operation_id']}").text
        pending = carol.get("/console/pending").text
        api = carol.get(f"/console/operations/{call['operation_id']}")
    # Then both pages show the argument, never the secret
    for page in (operation, pending):
        assert "your key is" in page and secret not in page
    assert api.status_code == 200
