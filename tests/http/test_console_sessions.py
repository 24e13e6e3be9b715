"""The console never shows what a URL says, ends sessions server-side, and guards its
sign-in form (issue #27): `why` from a closed set, a copied cookie refused after
sign-out (after a restart too), the sign-in form's CSRF token, failed sign-ins
limited per client address, and a secret-shaped principal never shown raw."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from urllib.parse import quote

import httpx
from servekit import Served
from test_console_forms import OP, A, csrf_of, pending_transfer, sign_in, signed_in

from executor.http.console import COOKIE, WHYS
from executor.http.keys import KeyScope
from executor.http.server import HttpSettings

HOSTILE = '<b id="x">Call +1-555-0100 now</b> sk-live0123456789abcdefXYZ'


def test_refusal_page__why_outside_its_closed_set__never_rendered(served: Served) -> None:
    # Given a signed-in approver
    with signed_in(served, served.key("acme", "carol", A, roles=("approver",))) as carol:
        # When a link carries attacker text as `why`, and when it carries a known code
        hostile = carol.get(f"/console/approvals?refused=approver_not_allowed&why={quote(HOSTILE)}")
        plain = carol.get("/console/approvals?refused=approver_not_allowed&why=CallNow_1555")
        known = carol.get("/console/approvals?refused=approver_not_allowed&why=role_not_allowed")
    # Then neither the text nor a word of it appears; the known code shows its own sentence
    for page in (hostile.text, plain.text):
        assert "The approver policy refused you" in page
        # (words with letters outside hex: the page's CSRF token is 40 hex digits)
        assert "+1-555" not in page and "sk-live" not in page and "CallNow" not in page
    assert f"The approver policy refused you: {WHYS['role_not_allowed']}" in known.text


def test_logout__a_copy_of_the_cookie__refused_afterwards_and_after_a_restart(
    served_with: Callable[..., Served],
) -> None:
    # Given a server whose sessions outlive a restart (a set session secret), and two
    # sessions of carol's
    http = HttpSettings(session_secret=b"k" * 32, rate_limit="10000/minute")
    first = served_with(http=http)
    key = first.key("acme", "carol", A, OP, roles=("approver",))
    with signed_in(first, key) as ended, signed_in(first, key) as kept:
        copied = ended.cookies[COOKIE]
        kept_cookie = kept.cookies[COOKIE]
        # When she signs out of one of them
        page = ended.get("/console/approvals").text
        out = ended.post("/console/logout", data={"csrf": csrf_of(page)})
        assert out.headers["location"] == "/console/login?notice=signed_out"
    # Then a copy of its cookie is refused, on this server and on a restarted one,
    # while the session she did not end still works on both
    restarted = served_with(http=http)
    for server in (first, restarted):
        with httpx.Client(base_url=server.url, cookies={COOKIE: copied}) as client:
            answer = client.get("/console/approvals")
            assert answer.status_code == 303
            assert answer.headers["location"] == "/console/login?refused=expired"
        with httpx.Client(base_url=server.url, cookies={COOKIE: kept_cookie}) as client:
            assert client.get("/console/approvals").status_code == 200


def test_login_form__without_its_csrf_token__no_session(served: Served) -> None:
    key = served.key("acme", "carol", A, roles=("approver",))
    with httpx.Client(base_url=served.url) as client:
        # When a page elsewhere posts the sign-in form: no token, a forged one, one
        # without the pre-session cookie it was made for
        bare = client.post("/console/login", data={"key": key})
        forged = client.post("/console/login", data={"key": key, "csrf": "0" * 40})
        token = csrf_of(client.get("/console/login").text)
        client.cookies.clear()
        stray = client.post("/console/login", data={"key": key, "csrf": token})
    # Then none signs anyone in
    for answer in (bare, forged, stray):
        assert answer.headers["location"] == "/console/login?refused=csrf"
        assert COOKIE not in answer.headers.get("set-cookie", "")


def test_login__failed_sign_ins__limited_per_address(served_with: Callable[..., Served]) -> None:
    # Given a server allowing 3 failed authentications a minute per address
    served = served_with(http=HttpSettings(session_secret=b"s" * 32, auth_failure_limit="3/minute"))
    key = served.key("acme", "carol", A, roles=("approver",))
    with httpx.Client(base_url=served.url) as client:
        # When 3 sign-ins fail (an unknown id, a known id's wrong secret)
        failed = [sign_in(client, f"tfk_{n:016x}_wrong") for n in range(2)]
        failed.append(sign_in(client, key[:-4] + "AAAA"))
        # Then the next one, even with the right key, waits, and so does the API from there
        limited = sign_in(client, key)
        api = client.get("/v1/approvals", headers={"Authorization": f"Bearer {key}"})
    assert [a.headers["location"] for a in failed] == ["/console/login?refused=invalid"] * 3
    assert limited.headers["location"] == "/console/login?refused=rate_limited"
    assert api.status_code == 429 and api.json()["code"] == "rate_limited"


def test_pages__secret_shaped_principal__shown_redacted(served: Served) -> None:
    # Given a transfer requested by a principal shaped like an API key, pending approval
    secret = "sk-proj0123456789abcdefghij"
    with served.client(served.key("acme", secret, KeyScope.PRODUCE)) as client:
        [call] = client.post(
            "/v1/requests",
            json={"calls": [{"call_id": "t1", "tool_name": "ledger.transfer", "arguments": {
                "source_account": "acme-1", "target_account": "acme-2", "amount_cents": 800_000}}]},
        ).json()["calls"]
    approver = served.key("acme", "sk-appr0123456789abcdefghij", A, roles=("approver",))
    # When the approvals are read over the API and in the console
    with served.client(approver) as client:
        listed = client.get("/v1/approvals")
    with signed_in(served, approver) as console:
        page = console.get("/console/approvals").text
    # Then neither shows either principal raw
    assert call["approval_id"] in listed.text and call["approval_id"] in page
    for text in (listed.text, page):
        assert "sk-proj" not in text and "sk-appr" not in text
        assert "[REDACTED]" in text
    assert listed.json()["approvals"][0]["requester"] == "[REDACTED]"


def test_api__secret_shaped_principal__redacted_in_who_decided_and_the_audit(served: Served) -> None:
    # Given alice's transfer pending approval, and an approver whose principal is shaped like a key
    call = pending_transfer(served)
    approver = served.key("acme", "sk-appr0123456789abcdefghij", A, KeyScope.READ, roles=("approver",))
    with served.client(approver) as client:
        # When it approves, and the operation is read
        decided = client.post(f"/v1/approvals/{call['approval_id']}/approve")
        record = client.get(f"/v1/operations/{call['operation_id']}")
    # Then who decided is [REDACTED] in the answer and in the audit trail shown
    assert decided.status_code == 200, decided.text
    assert decided.json()["decided_by"] == "[REDACTED]"
    assert "sk-appr" not in record.text
    assert "[REDACTED]" in [e["actor"] for e in record.json()["audit"]]


def _fresh_secret() -> HttpSettings:
    """What a server without TOOLFENCE_SESSION_SECRET makes at start: a random secret."""
    return HttpSettings(session_secret=secrets.token_bytes(32), rate_limit="10000/minute")


def test_restart__without_a_set_secret__old_session_lands_on_login_told_it_expired(
    served_with: Callable[..., Served],
) -> None:
    # Given carol signed in on a server whose session secret is made at start
    first = served_with(http=_fresh_secret())
    key = first.key("acme", "carol", A, roles=("approver",))
    with signed_in(first, key) as carol:
        cookie = carol.cookies[COOKIE]
    # When the server restarts (a new secret) and her browser asks for a page
    restarted = served_with(http=_fresh_secret())
    with httpx.Client(base_url=restarted.url, cookies={COOKIE: cookie}, follow_redirects=True) as client:
        answer = client.get("/console/approvals")
    # Then she lands on the sign-in page, told her session expired, and the dead cookie is dropped
    assert answer.url.path == "/console/login"
    assert "Your session expired" in answer.text
    deleted = answer.history[0].headers["set-cookie"]
    assert deleted.startswith(f'{COOKIE}=""') and "Max-Age=0" in deleted
    # And a browser that never signed in is not told so
    with httpx.Client(base_url=restarted.url, follow_redirects=True) as fresh:
        assert "Your session expired" not in fresh.get("/console/approvals").text
