"""`toolfence serve` over a real fleet: a producer that is not Python (curl), and
the operator console driven in a real browser (Debian's Chromium via Playwright).

The server is a `toolfence serve` subprocess; the relay, worker and reconciler
are the fleet's subprocesses; everything is checked through HTTP, the page, or
the database. The console's own walk-through, and the screenshots in docs/, are
tests/fleet/test_console_live.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleetkit import wait_until

from executor import store
from executor.http.keys import KeyScope, create_key
from executor.providers import SURFACES, encode_tool_name
from executor.settings import Settings
from executor.store.engine import make_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from servekit import free_port, serve_subprocess  # noqa: E402  (tests/http/servekit.py)

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def new_key(
    settings: Settings, tenant: str, principal: str, *scopes: KeyScope, roles: tuple[str, ...]
) -> str:
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            return create_key(conn, tenant=tenant, principal=principal, roles=roles, scopes=scopes)
    finally:
        engine.dispose()


@pytest.fixture
def server(settings: Settings, ledger: Any, fleet_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """`toolfence serve` on a private port over the fleet's database and tools."""
    port = free_port()
    log = tmp_path / "serve.log"
    process = serve_subprocess(fleet_env, port, log)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


def curl(*args: str) -> Any:
    result = subprocess.run(
        ["curl", "-sS", "--fail-with-body", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_curl_producer__anthropic_message__results_read_back_in_the_anthropic_shape(
    settings: Settings, server: str, make_fleet: Any, tmp_path: Path
) -> None:
    # Given a fleet, a produce key, and an Anthropic message proposing a read and an unknown tool
    assert shutil.which("curl"), "curl is required (the non-Python producer)"
    fleet = make_fleet(workers=1, concurrency=1).start()
    key = new_key(settings, "acme", "alice", KeyScope.PRODUCE, roles=("member",))
    message = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_balance",
                "name": encode_tool_name("ledger.get_balance", SURFACES["anthropic"].name_rule),
                "input": {"account_id": "acme-1"},
            },
            {"type": "tool_use", "id": "toolu_nope", "name": "wire_money_abroad", "input": {}},
        ],
    }
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"provider": "anthropic", "response": message}))
    auth = f"Authorization: Bearer {key}"
    # When curl posts it and long-polls the results in the Anthropic shape
    posted = curl(
        "-X",
        "POST",
        f"{server}/v1/requests",
        "-H",
        auth,
        "-H",
        "Content-Type: application/json",
        "-H",
        "Idempotency-Key: curl-1",
        "--data-binary",
        f"@{body}",
    )
    shaped = curl(
        "-G",
        f"{server}/v1/requests/{posted['request_id']}",
        "-H",
        auth,
        "--data-urlencode",
        "provider=anthropic",
        "--data-urlencode",
        "wait=30",
    )
    # Then both calls got exactly one tool_result each, in the user message the API expects
    assert shaped["settled"] is True, fleet.logs()
    [user_message] = shaped["results"]
    assert user_message["role"] == "user"
    blocks = {b["tool_use_id"]: b for b in user_message["content"]}
    assert list(blocks) == ["toolu_balance", "toolu_nope"]
    assert blocks["toolu_balance"]["is_error"] is False
    assert json.loads(blocks["toolu_balance"]["content"])["output"]["balance_cents"] == 10_000_000
    assert blocks["toolu_nope"]["is_error"] is True
    assert json.loads(blocks["toolu_nope"]["content"])["error"]["code"] == "unknown_tool"
    # And a retried POST with the same Idempotency-Key answers the same request
    again = curl(
        "-X",
        "POST",
        f"{server}/v1/requests",
        "-H",
        auth,
        "-H",
        "Content-Type: application/json",
        "-H",
        "Idempotency-Key: curl-1",
        "--data-binary",
        f"@{body}",
    )
    assert again["request_id"] == posted["request_id"]


def _mark_unknown(settings: Settings, operation_id: str) -> None:
    """What a worker that lost an unsafe write's outcome records (done before any worker runs)."""
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            reservation = store.reserve(conn, operation_id, "owner-lost", 30.0)
            assert reservation is not None
            assert store.mark_unknown(
                conn,
                operation_id,
                reservation.generation,
                owner_token="owner-lost",
                reason="the worker was killed during the downstream call",
            )
    finally:
        engine.dispose()


def test_console__approve_a_transfer_and_resolve_an_unsafe_write__in_chromium(
    settings: Settings, server: str, make_fleet: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is required: scripts/ci-deps.sh installs it"
    # Given a 5,000.00 transfer waiting for approval and an unsafe notice whose outcome is unknown
    alice = new_key(settings, "acme", "alice", KeyScope.PRODUCE, roles=("member",))
    carol = new_key(settings, "acme", "carol", KeyScope.APPROVE, KeyScope.OPERATE, roles=("approver",))
    gina = new_key(settings, "globex", "gina", KeyScope.APPROVE, KeyScope.OPERATE, roles=("approver",))
    produce = {"Authorization": f"Bearer {alice}"}
    notice = httpx.post(
        f"{server}/v1/requests",
        headers=produce,
        json={
            "calls": [
                {
                    "call_id": "n1",
                    "tool_name": "ledger.send_notice",
                    "arguments": {"account_id": "acme-1", "text": "Your statement is ready"},
                }
            ]
        },
    ).json()["calls"][0]
    _mark_unknown(settings, notice["operation_id"])
    transfer = httpx.post(
        f"{server}/v1/requests",
        headers=produce,
        json={
            "calls": [
                {
                    "call_id": "t1",
                    "tool_name": "ledger.transfer",
                    "arguments": {
                        "source_account": "acme-1",
                        "target_account": "acme-2",
                        "amount_cents": 500_000,
                    },
                }
            ]
        },
    ).json()["calls"][0]
    assert transfer["state"] == "pending_approval"
    # And a fleet to run what gets approved
    fleet = make_fleet(workers=1, concurrency=1).start()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # When carol signs in with her approve/operate key
            context = browser.new_context(viewport={"width": 1100, "height": 900})
            page = context.new_page()
            page.goto(f"{server}/console")
            page.fill("#key", carol)
            page.click("button[type=submit]")
            # Then the approvals page shows the transfer with its server-computed impact
            card = page.locator(f"[data-approval-id='{transfer['approval_id']}']")
            expect(card).to_contain_text("ledger.transfer")
            expect(card).to_contain_text("requested by alice")
            expect(card.locator("[data-testid=impact]")).to_contain_text("move 5000.00 from acme-1 to acme-2")
            expect(card).to_contain_text("account:acme-1")
            cookie = {c["name"]: c for c in context.cookies()}["toolfence_session"]
            assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
            assert carol.split("_", 2)[2] not in cookie["value"]
            page.screenshot(path=str(tmp_path / "console-approvals.png"), full_page=True)
            # And a form posted without its CSRF token changes nothing
            forged = httpx.post(
                f"{server}/console/approvals/{transfer['approval_id']}/approve",
                cookies={"toolfence_session": cookie["value"]},
                data={"csrf": "forged"},
            )
            assert forged.status_code == 303 and "refused=csrf" in forged.headers["location"]
            # When she approves it
            card.locator("button.approve").click()
            expect(page.locator(".notice")).to_contain_text("Approved")
            expect(page.locator(f"[data-approval-id='{transfer['approval_id']}']")).to_have_count(0)
            # Then the operation reaches succeeded on the fleet, one side effect, approved by carol
            page.goto(f"{server}/console/operations/{transfer['operation_id']}")

            def succeeded() -> bool:
                page.reload()
                return page.locator("[data-testid=state]").inner_text() == "succeeded"

            wait_until(succeeded, timeout=40, what="the approved transfer to succeed", show=fleet.logs)
            expect(page.locator("[data-testid=side-effects]")).to_have_text("1")
            expect(page.locator("[data-testid=audit]")).to_contain_text("carol")
            # When she opens "Needs a person" and says the notice was sent, with its reference
            page.click("text=Needs a person")
            pending = page.locator(f"[data-operation-id='{notice['operation_id']}']")
            expect(pending.locator("[data-testid=cause]")).to_have_text("reconciliation_pending")
            pending.locator("input[name=reference]").fill("notice-4711")
            pending.locator("button.approve").click()
            # Then the operation is succeeded with that receipt, resolved by carol
            expect(page.locator("[data-testid=state]")).to_have_text("succeeded")
            expect(page.locator("[data-testid=side-effects]")).to_have_text("1")
            expect(page.locator("body")).to_contain_text("notice-4711")
            expect(page.locator("[data-testid=audit]")).to_contain_text("resolved_succeeded")
            # When she signs out, a copy of her session cookie is refused (recorded server-side)
            page.click("button:has-text('Sign out')")
            expect(page.locator(".notice")).to_contain_text("Signed out")
            copied = httpx.get(
                f"{server}/console/approvals", cookies={"toolfence_session": cookie["value"]}
            )
            assert copied.status_code == 303
            assert copied.headers["location"] == "/console/login?refused=expired"

            # When a key of another tenant signs in
            other = browser.new_context().new_page()
            other.goto(f"{server}/console/login")
            other.fill("#key", gina)
            other.click("button[type=submit]")
            # Then it sees neither queue's items, and acme's operation does not exist for it
            expect(other.locator("[data-testid=who]")).to_contain_text("globex")
            expect(other.locator("main")).to_contain_text("Nothing is waiting for an approval")
            other.goto(f"{server}/console/pending")
            expect(other.locator("main")).to_contain_text("Nothing is waiting for a person")
            response = other.goto(f"{server}/console/operations/{transfer['operation_id']}")
            assert response is not None and response.status == 404
            expect(other.locator("main")).not_to_contain_text("ledger.transfer")
        finally:
            browser.close()
    # And the database agrees: carol approved, carol resolved
    engine = make_engine(settings.database_url)
    with engine.connect() as conn:
        approved = [
            e.actor
            for e in store.audit_trail(conn, transfer["operation_id"])
            if e.decision_code == "approved"
        ]
        resolved = [
            e.actor
            for e in store.audit_trail(conn, notice["operation_id"])
            if e.decision_code == "resolved_succeeded"
        ]
    engine.dispose()
    assert approved == ["carol"] and resolved == ["carol"]
