"""The operator console as a person uses it, in Debian's Chromium (Playwright), against
a real `toolfence serve` subprocess with a real relay, worker and reconciler.

First the stale-impact case (decision 0222): two transfers from one account wait for
approval; once one is approved and has run, the other card shows the new balance
without a reload (the live region, decision 0223), and a page that still shows the
old figures (JavaScript off) cannot approve on them: `impact_changed`, a banner.
Then each page a person needs: the lists and their filters, an operation's record,
"Needs a person" with its known receipt and the confirmation before running an unsafe
write again, a turn's steps; axe-core's checks (labels, names, contrast) on each
page, a skip link, no sideways scroll at 390 px. Set TOOLFENCE_SCREENSHOT_DIR to keep
the screenshots (docs/console-*.png are made that way).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleetkit import wait_until
from test_fleet_turns import write_script
from test_http_console import CHROMIUM, CHROMIUM_ARGS, _mark_unknown, new_key

from executor import store
from executor.cli.fleet import Fleet
from executor.http.keys import KeyScope
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger.service import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from servekit import free_port, serve_subprocess  # noqa: E402  (tests/http/servekit.py)

pytestmark = pytest.mark.slow

A, OP, P = KeyScope.APPROVE, KeyScope.OPERATE, KeyScope.PRODUCE
# The live region asks every 2 s; a worker runs an approved transfer within seconds.
LIVE_TIMEOUT_MS = 40_000


@pytest.fixture
def server(
    settings: Settings, ledger: Ledger, fleet_env: dict[str, str], tmp_path: Path
) -> Iterator[str]:
    """`toolfence serve` over the fleet's database and tools, its turns on a scripted model."""
    script = write_script(tmp_path / "turn.jsonl")
    port = free_port()
    process = serve_subprocess(
        {**fleet_env, "TOOLFENCE_TURN_DRIVER": f"scripted:{script}"}, port, tmp_path / "serve.log"
    )
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is required: scripts/ci-deps.sh installs it"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def sign_in(browser: Any, server: str, key: str, **context: Any) -> Any:
    page = browser.new_context(**{"viewport": {"width": 1100, "height": 900}, **context}).new_page()
    page.goto(f"{server}/console/login")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server}/console/approvals")
    return page


def post_transfer(server: str, key: str, call_id: str, cents: int) -> dict[str, Any]:
    call = {
        "call_id": call_id, "tool_name": "ledger.transfer",
        "arguments": {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": cents},
    }
    answer = httpx.post(f"{server}/v1/requests", headers={"Authorization": f"Bearer {key}"},
                        json={"calls": [call]}, timeout=30)
    assert answer.status_code == 202, answer.text
    posted: dict[str, Any] = answer.json()["calls"][0]
    assert posted["state"] == "pending_approval"
    return posted


def operation_state(settings: Settings, operation_id: str) -> str:
    engine = make_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            row = store.get_operation(conn, operation_id)
    finally:
        engine.dispose()
    assert row is not None
    return row.state


def shoot(page: Any, name: str, tmp_path: Path) -> None:
    targets = [tmp_path / name]
    if os.environ.get("TOOLFENCE_SCREENSHOT_DIR"):
        targets.append(Path(os.environ["TOOLFENCE_SCREENSHOT_DIR"]) / name)
    for path in targets:
        page.screenshot(path=str(path), full_page=True)


def test_stale_impact__other_card_shows_the_new_balance_live__old_digest_refused_impact_changed(
    settings: Settings, server: str, ledger: Ledger, make_fleet: Callable[..., Fleet], browser: Any,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    # Given acme-1 holds 100,000.00 and two transfers from it wait: 60,000.00 and 50,000.00
    alice = new_key(settings, "acme", "alice", P, roles=("member",))
    carol = new_key(settings, "acme", "carol", A, OP, roles=("approver",))
    first = post_transfer(server, alice, "t1", 6_000_000)
    second = post_transfer(server, alice, "t2", 5_000_000)
    fleet = make_fleet(workers=1, concurrency=1).start()
    # When carol opens the approvals (live), and again in a browser without JavaScript
    page = sign_in(browser, server, carol)
    frozen = sign_in(browser, server, carol, java_script_enabled=False)
    card = page.locator(f"[data-approval-id='{second['approval_id']}']")
    # Then each card shows the balance in the ledger's currency, as of now, and the other transfer
    expect(card.locator("[data-field=source_balance_cents]")).to_have_text("100,000.00 USD")
    expect(card.locator("[data-field=amount_cents]")).to_have_text("50,000.00 USD")
    as_of = re.compile(r"as of \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
    expect(card.locator("[data-testid=as-of]")).to_contain_text(as_of)
    expect(card.locator("[data-testid=related]")).to_contain_text(first["operation_id"])
    expect(card.locator("[data-testid=related]")).to_contain_text("pending_approval")
    shoot(page, "console-approvals.png", tmp_path)
    # When she approves the first, and it runs on the fleet
    named = f"Approve ledger.transfer requested by alice, {first['approval_id']}"
    page.get_by_role("button", name=named).click()
    expect(page.locator(".notice")).to_contain_text("Approved")
    page.evaluate("window.__notReloaded = 'still this page'")
    wait_until(lambda: operation_state(settings, first["operation_id"]) == "succeeded",
               timeout=40, what="the first transfer to run", show=fleet.logs)
    # Then, without a reload, the other card shows the new balance
    balance = card.locator("[data-field=source_balance_cents]")
    expect(balance).to_have_text("40,000.00 USD", timeout=LIVE_TIMEOUT_MS)
    expect(card.locator("[data-field=source_balance_after_cents]")).to_have_text("-10,000.00 USD")
    assert page.evaluate("window.__notReloaded") == "still this page"
    # When the page that still shows 100,000.00 approves the second on those figures
    stale = frozen.locator(f"[data-approval-id='{second['approval_id']}']")
    expect(stale.locator("[data-field=source_balance_cents]")).to_have_text("100,000.00 USD")
    stale.locator("button.approve").click()
    # Then nothing is decided: a banner says the impact changed, and the card shows the new figures
    expect(frozen.locator("[data-testid=refused]")).to_contain_text("The impact changed since you saw it")
    expect(stale.locator("[data-field=source_balance_cents]")).to_have_text("40,000.00 USD")
    assert operation_state(settings, second["operation_id"]) == "pending_approval"
    # When she approves it on the new figures (the live page), it runs and the ledger refuses it
    card.locator("button.approve").click()
    expect(page.locator(".notice")).to_contain_text("Approved")
    wait_until(lambda: operation_state(settings, second["operation_id"]) == "failed_terminal",
               timeout=40, what="the second transfer to end", show=fleet.logs)
    page.goto(f"{server}/console/operations/{second['operation_id']}")
    # Then its page says why, and who approved it when
    expect(page.locator("[data-testid=error-message]")).to_contain_text("insufficient funds")
    expect(page.locator("[data-testid=approval-decision]")).to_contain_text("approved by carol")
    assert ledger.balance("acme-1") == 4_000_000


def _console_world(settings: Settings, server: str) -> dict[str, Any]:
    """A transfer awaiting approval, and two unsafe notices whose outcome is unknown (one
    with the receipt a worker saw), made before any worker runs."""
    alice = new_key(settings, "acme", "alice", P, roles=("member",))
    auth = {"Authorization": f"Bearer {alice}"}
    # (one request each: a write of a request waits for the request's earlier writes)
    notices = [
        httpx.post(f"{server}/v1/requests", headers=auth, timeout=30, json={"calls": [
            {"call_id": f"n{i}", "tool_name": "ledger.send_notice",
             "arguments": {"account_id": "acme-1", "text": f"Statement {i}"}},
        ]}).json()["calls"][0]
        for i in (1, 2)
    ]
    for n in notices:
        _mark_unknown(settings, n["operation_id"])
    engine = make_engine(settings.database_url)
    with engine.begin() as conn:
        row = store.get_operation(conn, notices[0]["operation_id"])
        assert row is not None
        store.record_receipt(
            conn, row.operation_id, row.generation, "notice-4711", accepted=True, source="worker"
        )
    engine.dispose()
    transfer = post_transfer(server, alice, "t9", 700_000)
    return {"alice": alice, "known": notices[0], "again": notices[1], "transfer": transfer}


def _no_sideways_scroll(page: Any) -> None:
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"{page.url} scrolls sideways: {width}"


def _accessible(page: Any) -> None:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page, options={"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa"]}})
    assert results.violations_count == 0, f"{page.url}:\n{results.generate_report()}"


def test_console_pages__lists_record_pending_turns__accessible_and_390px(
    settings: Settings, server: str, make_fleet: Callable[..., Fleet], browser: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    world = _console_world(settings, server)
    carol = new_key(settings, "acme", "carol", A, OP, roles=("approver",))
    fleet = make_fleet(workers=1, concurrency=2, relays=1, reconcile_every=0.3).start()
    # And a turn of alice's that runs on the fleet (a read, a credit, an answer)
    turn = httpx.post(f"{server}/v1/turns", headers={"Authorization": f"Bearer {world['alice']}"},
                      json={"conversation_id": "conv-9", "message": "Credit acme-2"}, timeout=30).json()
    page = sign_in(browser, server, carol)

    # The approvals page: each button names its card; a skip link comes first
    approve = page.get_by_role(
        "button", name=f"Approve ledger.transfer requested by alice, {world['transfer']['approval_id']}"
    )
    expect(approve).to_have_count(1)
    expect(page.get_by_label(f"Reason for denying ledger.transfer requested by alice, "
                             f"{world['transfer']['approval_id']}")).to_have_count(1)
    page.keyboard.press("Tab")
    expect(page.locator(".skip")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    _accessible(page)

    # Needs a person: age, arguments, the receipt toolfence saw offered as the reference
    page.get_by_role("link", name="Needs a person").click()
    known = page.locator(f"[data-operation-id='{world['known']['operation_id']}']")
    expect(known.locator("[data-testid=age]")).to_contain_text("waiting")
    expect(known.locator("[data-testid=arguments]")).to_contain_text("Statement 1")
    expect(known.locator("[data-testid=known-receipt]")).to_have_value("notice-4711")
    _accessible(page)
    # "Run it again" on an unsafe write warns, and will not submit unconfirmed
    again = page.locator(f"[data-operation-id='{world['again']['operation_id']}']")
    again.locator("summary").click()
    expect(again.locator(".warning")).to_contain_text("running it again does it twice")
    shoot(page, "console-pending.png", tmp_path)
    again.get_by_role("button", name=re.compile("^Run it again")).click()
    expect(again).to_have_count(1)  # the required confirmation kept the form from posting
    assert operation_state(settings, world["again"]["operation_id"]) == "reconciliation_pending"
    again.get_by_role("checkbox").check()
    again.get_by_role("button", name=re.compile("^Run it again")).click()
    expect(page.locator(".notice")).to_contain_text("Resolved")
    wait_until(lambda: operation_state(settings, world["again"]["operation_id"]) == "succeeded",
               timeout=40, what="the notice run again", show=fleet.logs)
    # "It happened" with the offered receipt: one receipt, shown once, accepted (never `True`)
    page.get_by_role("link", name="Needs a person").click()
    known.get_by_role("button", name=re.compile("^It happened")).click()
    expect(page.locator("[data-testid=state]")).to_have_text("succeeded")
    receipts = page.locator("[data-testid=receipts]")
    expect(receipts.locator("tr", has_text="notice-4711")).to_have_count(1)
    expect(receipts).to_contain_text("accepted")
    expect(receipts).not_to_contain_text("True")
    expect(page.locator("[data-testid=audit]")).to_contain_text(re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"))
    expect(page.locator("[data-testid=attempts]")).not_to_contain_text("(1 attempts)")
    expect(page.locator("[data-testid=calls]")).to_contain_text("succeeded")
    expect(page.locator("[data-testid=arguments]")).to_contain_text("Statement 1")
    shoot(page, "console-operation.png", tmp_path)
    _accessible(page)

    # The operations list: state counts at the top, a filter by tool
    page.get_by_role("link", name="Operations", exact=True).click()
    expect(page.locator("[data-testid=state-counts]")).to_contain_text("pending_approval 1")
    page.get_by_label("Tool").select_option("ledger.send_notice")
    page.get_by_role("button", name="Filter operations").click()
    rows = page.locator("[data-testid=rows] tr[data-operation-id]")
    expect(rows).to_have_count(2)
    shoot(page, "console-operations.png", tmp_path)
    _accessible(page)

    # The turns: the list, then the turn's steps with its calls, linking to an operation
    wait_until(lambda: _turn_state(server, world["alice"], turn["turn_id"]) == "succeeded",
               timeout=60, what="the turn to end", show=fleet.logs)
    page.get_by_role("link", name="Turns").click()
    page.get_by_role("link", name=turn["turn_id"]).click()
    expect(page.locator("[data-testid=turn-state]")).to_have_text("succeeded")
    expect(page.locator("[data-testid=step]")).to_have_count(3)
    expect(page.locator("[data-testid=step-calls]").first).to_contain_text("ledger.get_balance")
    expect(page.locator("[data-testid=usage]").first).to_contain_text(" in, ")
    shoot(page, "console-turn.png", tmp_path)
    _accessible(page)
    page.locator("[data-testid=step-calls] a", has_text="operation").nth(1).click()
    expect(page.locator("body")).to_contain_text("ledger.credit")

    # At 390 px nothing scrolls sideways, on every page
    phone = sign_in(browser, server, carol, viewport={"width": 390, "height": 844})
    for path in ("/console/approvals", "/console/pending", "/console/operations", "/console/requests",
                 "/console/turns", f"/console/turns/{turn['turn_id']}",
                 f"/console/operations/{world['known']['operation_id']}"):
        phone.goto(f"{server}{path}")
        _no_sideways_scroll(phone)
    phone.goto(f"{server}/console/approvals")
    shoot(phone, "console-approvals-390.png", tmp_path)


def _turn_state(server: str, key: str, turn_id: str) -> str:
    answer = httpx.get(f"{server}/v1/turns/{turn_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    state: str = answer.json()["state"]
    return state


def test_server_restart__old_session_lands_on_sign_in_told_it_expired(
    settings: Settings, ledger: Ledger, fleet_env: dict[str, str], browser: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    # Given carol signed in on a server without a set session secret (one is made at start),
    # in two browsers: one without JavaScript (she reloads it), one with it (left alone: its
    # live refresh finds out by itself). Without JavaScript the reload is the only request,
    # so the live refresh cannot take the expired cookie first and race the reload.
    port = free_port()
    env = {k: v for k, v in fleet_env.items() if k != "TOOLFENCE_HTTP_SESSION_SECRET"}
    first = serve_subprocess(env, port, tmp_path / "serve-1.log")
    carol = new_key(settings, "acme", "carol", A, OP, roles=("approver",))
    try:
        page = sign_in(browser, f"http://127.0.0.1:{port}", carol, java_script_enabled=False)
        live = sign_in(browser, f"http://127.0.0.1:{port}", carol)
    finally:
        first.terminate()
        first.wait(timeout=15)
    # When the server restarts and she reloads her page
    second = serve_subprocess(env, port, tmp_path / "serve-2.log")
    try:
        page.reload()
        # Then she is on the sign-in page, told her session expired, and can sign in again
        expect(page).to_have_url(re.compile(r"/console/login\?refused=expired$"))
        # ... and the page she left alone went there by itself
        expect(live).to_have_url(re.compile(r"/console/login\?refused=expired$"), timeout=30_000)
        expect(live.locator("main")).to_contain_text("Your session expired")
        expect(page.locator("main")).to_contain_text("Your session expired")
        page.fill("#key", carol)
        page.click("button[type=submit]")
        expect(page.locator("h1")).to_have_text("Approvals")
    finally:
        second.terminate()
        second.wait(timeout=15)
