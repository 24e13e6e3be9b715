"""`toolfence demo --serve` leaves work for the person at the console: two transfers
from one account waiting for approval and a notice of unknown outcome (the demo
decides its own approvals, so the console would otherwise be empty). The demo runs
as a user runs it (a subprocess, its own TOOLFENCE_HOME); the console is its real
`toolfence serve`, driven here through the API with the key the demo printed."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_demo import _processes_mentioning, _start_demo, _wait_for

from tests.netkit import free_port

pytestmark = pytest.mark.slow


def test_demo_serve__leaves_two_approvals_and_a_pending_notice__approving_one_runs_it(tmp_path: Path) -> None:
    # Given the demo with its console, on a small workload
    port = free_port()
    output = tmp_path / "demo.out"
    demo = _start_demo(tmp_path / "home", output, "--calls", "12", "--workers", "1", "--serve",
                       "--serve-port", str(port))
    try:
        # When it has reported and says what it left
        assert _wait_for(lambda: "Left for you at" in output.read_text(errors="replace"), 240), (
            output.read_text(errors="replace")
        )
        text = output.read_text(errors="replace")
        assert "All invariants hold." in text, text
        key = re.search(r"sign in with the key (\S+)", text)
        assert key, text
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                           headers={"Authorization": f"Bearer {key.group(1)}"})
        # Then two transfers from acme-operating wait for approval, each naming the other
        cards = api.get("/v1/approvals").json()["approvals"]
        left = [c for c in cards if c["requester"] == "alice@acme"]
        assert len(left) == 2, cards
        assert {r["operation_id"] for r in left[0]["related"]} >= {left[1]["operation_id"]}
        # And a notice waits for a person
        pending = api.get("/v1/pending").json()["operations"]
        assert any(p["tool"] == "ledger.send_notice" for p in pending), pending
        # When the person approves one on the figures shown, the demo's fleet runs it
        first, second = left
        approved = api.post(f"/v1/approvals/{first['approval_id']}/approve",
                            json={"impact_digest": first["impact_digest"]})
        assert approved.status_code == 200, approved.text

        def ran() -> bool:
            state: Any = api.get(f"/v1/operations/{first['operation_id']}").json()["state"]
            return bool(state == "succeeded")

        assert _wait_for(ran, 60, interval=0.5), output.read_text(errors="replace")
        # Then the other card's impact shows the new balance, and its old digest is refused
        cards = api.get("/v1/approvals").json()["approvals"]
        [now] = [c for c in cards if c["approval_id"] == second["approval_id"]]
        moved = first["impact"]["amount_cents"]
        assert now["impact"]["source_balance_cents"] == second["impact"]["source_balance_cents"] - moved
        stale = api.post(f"/v1/approvals/{second['approval_id']}/approve",
                         json={"impact_digest": second["impact_digest"]})
        assert stale.status_code == 409 and stale.json()["code"] == "impact_changed"
        api.close()
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=60)
    leftovers = lambda: _processes_mentioning(str(tmp_path))  # noqa: E731
    assert _wait_for(lambda: not leftovers(), 15), leftovers()
