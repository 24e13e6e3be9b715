"""The impact an approver decides on is the current one (decision 0222): recomputed on
current state when `GET /v1/approvals` answers and again when the approval is decided,
with a digest the approval carries; a stale digest is refused 409 `impact_changed`.

In-process server over PostgreSQL and the reference ledger (tests/http/conftest.py):
the ledger's balance is moved between showing and deciding, as another approved
transfer would move it.
"""

from __future__ import annotations

import json
from typing import Any

from servekit import Served
from sqlalchemy import select
from test_api import A, P, assert_problem, transfer

from executor import Amount
from executor.core.impact import impact_digest
from executor.http.cards import iso
from executor.store.schema import approvals, operations
from ledger.service import Ledger


def _two_transfers(served: Served) -> tuple[dict[str, Any], dict[str, Any]]:
    alice = served.key("acme", "alice", P)
    with served.client(alice) as client:
        first = client.post("/v1/requests", json={"calls": [transfer("t1", 600_000)]}).json()["calls"][0]
        second = client.post("/v1/requests", json={"calls": [transfer("t2", 550_000)]}).json()["calls"][0]
    assert first["state"] == second["state"] == "pending_approval"
    return first, second


def _cards(served: Served, key: str) -> dict[str, dict[str, Any]]:
    with served.client(key) as client:
        answer = client.get("/v1/approvals")
    assert answer.status_code == 200, answer.text
    return {a["approval_id"]: a for a in answer.json()["approvals"]}


def test_approvals__impact_is_recomputed_on_current_state__with_digest_hints_and_related(
    served: Served, book: Ledger
) -> None:
    # Given two transfers from acme-1 waiting for approval
    first, second = _two_transfers(served)
    carol = served.key("acme", "carol", A, roles=("approver",))
    # When carol reads the approvals, then the ledger moves 400.00 out of acme-1, and she reads again
    before = _cards(served, carol)
    book.credit(
        key="k-out", operation_id="elsewhere", generation=1, account_id="acme-1", amount_cents=-40_000
    )
    after = _cards(served, carol)
    # Then each card shows the balance as it is when read, with a new digest
    card = before[second["approval_id"]]
    later = after[second["approval_id"]]
    assert card["impact"]["source_balance_cents"] == 1_000_000
    assert later["impact"]["source_balance_cents"] == 960_000
    assert later["impact_digest"] == impact_digest(later["impact"])
    assert card["impact_digest"] != later["impact_digest"]
    assert card["impact_current"] is True and card["impact_as_of"].endswith("Z")
    # And the tool's display hints, and the other transfer on the same account
    assert card["amounts"]["amount_cents"] == {"currency": "USD", "decimals": 2}
    related = [(r["operation_id"], r["state"]) for r in card["related"]]
    assert related == [(first["operation_id"], "pending_approval")]
    assert card["related"][0]["shared"] == ["account:acme-1", "account:acme-2"]
    assert card["related_count"] == 1


def test_approve__stale_digest__impact_changed_and_nothing_decided__current_digest_approves(
    served: Served, book: Ledger
) -> None:
    # Given two transfers from acme-1 (10,000.00) of 6,000.00 and 5,500.00, both shown to carol
    first, second = _two_transfers(served)
    carol = served.key("acme", "carol", A, roles=("approver",))
    shown = _cards(served, carol)
    with served.client(carol) as client:
        # When she approves the first on what she was shown, and it runs (the ledger moves)
        one = client.post(
            f"/v1/approvals/{first['approval_id']}/approve",
            json={"impact_digest": shown[first["approval_id"]]["impact_digest"]},
        )
        book.credit(key="k-run", operation_id=first["operation_id"], generation=1, account_id="acme-1",
                    amount_cents=-600_000)
        # And approves the second on the figures she saw before
        stale = client.post(
            f"/v1/approvals/{second['approval_id']}/approve",
            json={"impact_digest": shown[second["approval_id"]]["impact_digest"]},
        )
        # And a digest that is not hex is refused as the schema says (422)
        malformed = client.post(f"/v1/approvals/{second['approval_id']}/approve", json={"impact_digest": "x"})
    # Then the first is approved on its digest
    assert one.status_code == 200, one.text
    assert one.json()["impact_digest"] == shown[first["approval_id"]]["impact_digest"]
    # And the second is refused impact_changed, naming the current digest, and stays pending
    problem = assert_problem(stale, 409, "impact_changed")
    now = _cards(served, carol)[second["approval_id"]]
    expected = {"path": "/impact_digest", "code": "stale", "expected": now["impact_digest"]}
    assert problem["errors"] == [expected]
    assert now["impact"]["source_balance_cents"] == 400_000
    assert now["impact"]["source_balance_after_cents"] == -150_000
    assert_problem(malformed, 422, "invalid_request")
    with served.engine.connect() as conn:
        state = conn.execute(
            select(operations.c.state).where(operations.c.operation_id == second["operation_id"])
        ).scalar_one()
    assert state == "pending_approval"
    # When she decides again on the new figures, it is approved, and the row keeps that impact
    with served.client(carol) as client:
        again = client.post(
            f"/v1/approvals/{second['approval_id']}/approve", json={"impact_digest": now["impact_digest"]}
        )
    assert again.status_code == 200, again.text
    with served.engine.connect() as conn:
        kept = conn.execute(
            select(approvals.c.impact).where(approvals.c.approval_id == second["approval_id"])
        ).scalar_one()
    assert json.loads(kept) == now["impact"]


def test_deny__stale_digest__still_denies(served: Served, book: Ledger) -> None:
    # Given a transfer shown to carol, whose account then moves
    first, _ = _two_transfers(served)
    carol = served.key("acme", "carol", A, roles=("approver",))
    shown = _cards(served, carol)[first["approval_id"]]
    book.credit(key="k-d", operation_id="elsewhere", generation=1, account_id="acme-1", amount_cents=-1)
    # When she denies it with the digest she saw
    with served.client(carol) as client:
        denied = client.post(
            f"/v1/approvals/{first['approval_id']}/deny",
            json={"reason": "not today", "impact_digest": shown["impact_digest"]},
        )
        record = client.get(f"/v1/operations/{first['operation_id']}").json()
    # Then a no needs no current figures: it is denied, and the reason is on the operation
    assert denied.status_code == 200, denied.text
    assert record["approval"] == {
        "state": "denied", "decided_by": "carol", "decided_at": record["approval"]["decided_at"],
        "reason": "not today",
    }
    assert record["error_message"] == "approval denied"


def test_amount__formats_minor_units__and_refuses_a_bad_hint() -> None:
    # Given the ledger's hint
    usd = Amount("USD", 2)
    # Then integers read as money, anything else is not formatted
    assert usd.format(123_456) == "1,234.56 USD"
    assert usd.format(-150_000) == "-1,500.00 USD"
    assert usd.format(5) == "0.05 USD"
    assert Amount("JPY", 0).format(1200) == "1,200 JPY"
    assert usd.format("12") is None and usd.format(True) is None and usd.format(1.5) is None
    for bad in ({"currency": ""}, {"currency": "USD", "decimals": 9}, {"currency": "USD", "decimals": True}):
        try:
            Amount(**bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")
    assert iso(0.0) == "1970-01-01T00:00:00Z" and iso(None) is None
