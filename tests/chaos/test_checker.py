"""The checker itself: each violation it must catch, caught, on small handmade histories.

No services: these run in a fraction of a second with the unit tests. A checker
that cannot fail would make the campaign a decoration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from outbox.producer import default_operation_id
from tests.chaos.checker import check

OP = "op_write"
READ = "op_read"
KEY = f"toolfence:{OP}"


def _events(tool: str = "ledger.transfer") -> list[dict[str, Any]]:
    """One request: a write (succeeded at generation 2 after a requeue) and a read."""
    audit = [
        (1, OP, None, "queued", "admitted", 0, None, 10.0),
        (2, OP, "queued", "started", "reserved", 1, None, 11.0),
        (3, OP, "started", "queued", "requeued_stale", 1, "reconciler", 14.0),
        (4, OP, "queued", "started", "reserved", 2, None, 15.0),
        (5, OP, "started", "succeeded", "succeeded", 2, None, 16.0),
        (6, READ, None, "queued", "admitted", 0, None, 10.0),
        (7, READ, "queued", "started", "reserved", 1, None, 16.5),
        (8, READ, "started", "succeeded", "succeeded", 1, None, 17.0),
    ]
    kind = {"ledger.transfer": "transfer", "ledger.create_invoice": "invoice"}[tool]
    return [
        {"kind": "admission", "request_id": "r1", "call_id": "c0", "tool": tool,
         "proposed_tool": tool, "operation_id": OP, "status": "pending"},
        {"kind": "admission", "request_id": "r1", "call_id": "c1", "tool": "ledger.get_balance",
         "proposed_tool": "ledger.get_balance", "operation_id": READ, "status": "pending"},
        {"kind": "admission", "tenant": "t1", "request_id": "r1", "call_id": "c2", "tool": "ledger.nope",
         "proposed_tool": "ledger.nope", "operation_id": None, "status": "failed_terminal",
         "code": "unknown_tool"},
        {"kind": "quiet", "quiet_seconds": 1.0, "bound_seconds": 5.0},
        {"kind": "db.operations", "operation_id": OP, "request_id": "r1", "call_id": "c0",
         "tool_name": tool, "mode": "write", "state": "succeeded", "generation": 2,
         "receipt": "rc-1", "error_code": None, "error": None, "attempts": 2},
        {"kind": "db.operations", "operation_id": READ, "request_id": "r1", "call_id": "c1",
         "tool_name": "ledger.get_balance", "mode": "read", "state": "succeeded", "generation": 1,
         "receipt": None, "error_code": None, "error": None, "attempts": 1},
        *[
            {"kind": "db.audit", "event_id": i, "operation_id": op, "from_state": f, "to_state": t,
             "decision_code": d, "generation": g, "actor": a, "at": at}
            for i, op, f, t, d, g, a, at in audit
        ],
        {"kind": "db.receipts", "operation_id": OP, "generation": 2, "receipt": "rc-1",
         "accepted": True, "source": "worker", "recorded_at": 15.9},
        {"kind": "db.effects", "receipt": "rc-1", "operation_id": OP, "idempotency_key": KEY,
         "generation": 2, "at": 15.8, "effect_kind": kind},
        {"kind": "db.calls", "request_id": "r1", "call_id": "c0", "position": 0, "tool_name": tool,
         "operation_id": OP, "gate": None},
        {"kind": "db.calls", "request_id": "r1", "call_id": "c1", "position": 1,
         "tool_name": "ledger.get_balance", "operation_id": READ, "gate": None},
        {"kind": "db.calls", "request_id": "r1", "call_id": "c2", "position": 2,
         "tool_name": "ledger.nope", "operation_id": None, "gate": "allowlist"},
        {"kind": "db.final_results", "request_id": "r1", "call_id": "c0", "tool_name": tool,
         "status": "succeeded"},
        {"kind": "db.final_results", "request_id": "r1", "call_id": "c1",
         "tool_name": "ledger.get_balance", "status": "succeeded"},
        {"kind": "db.final_results", "request_id": "r1", "call_id": "c2", "tool_name": "ledger.nope",
         "status": "failed_terminal"},
    ]


def _check(tmp_path: Path, events: list[dict[str, Any]]) -> dict[str, Any]:
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"t": 0.0, **e}) + "\n" for e in events))
    return check(path)


def _replace(events: list[dict[str, Any]], kind: str, match: dict[str, Any], **changes: Any) -> None:
    for e in events:
        if e["kind"] == kind and all(e.get(k) == v for k, v in match.items()):
            e.update(changes)


def test_check__clean_history__passes_and_counts_the_recovery(tmp_path: Path) -> None:
    report = _check(tmp_path, _events())
    assert report["ok"], report["invariants"]
    assert report["counts"]["recovered"] == 1
    assert report["counts"]["operations"] == 2


def test_check__second_effect_for_one_operation__duplicated_and_i1(tmp_path: Path) -> None:
    events = _events("ledger.create_invoice")
    events.append({"kind": "db.effects", "receipt": "rc-2", "operation_id": OP,
                   "idempotency_key": KEY, "generation": 1, "at": 17.0, "effect_kind": "invoice"})
    report = _check(tmp_path, events)
    assert report["counts"]["duplicated"] == 1
    assert not report["invariants"]["I1"]["ok"]
    assert not report["ok"]


def test_check__admitted_operation_left_queued__lost_and_i4(tmp_path: Path) -> None:
    events = _events()
    _replace(events, "db.operations", {"operation_id": READ}, state="queued")
    _replace(events, "db.final_results", {"call_id": "c1"}, status="pending", state="queued")
    report = _check(tmp_path, events)
    assert report["counts"]["lost"] == 1
    assert not report["invariants"]["I4"]["ok"]
    assert not report["invariants"]["I6"]["ok"]  # no terminal result for c1


def test_check__succeeded_write_without_effect__lost(tmp_path: Path) -> None:
    events = [e for e in _events() if e["kind"] != "db.effects"]
    assert _check(tmp_path, events)["counts"]["lost"] == 1


def test_check__fenced_downstream_accepts_older_token__stale_write_and_i3(tmp_path: Path) -> None:
    events = _events()
    # generation 2 wrote first (the effect above, at 15.8); generation 1 lands later
    _replace(events, "db.effects", {"operation_id": OP}, generation=1, at=15.95)
    events.append({"kind": "db.fenced", "operation_id": OP, "idempotency_key": KEY, "token": 2,
                   "highest_token": 2, "at": 15.5})
    report = _check(tmp_path, events)
    assert report["counts"]["accepted_stale_writes"] == 1
    assert not report["invariants"]["I3"]["ok"]


def test_check__generation_going_back__i5(tmp_path: Path) -> None:
    events = _events()
    _replace(events, "db.audit", {"event_id": 5}, generation=1)
    report = _check(tmp_path, events)
    assert not report["invariants"]["I5"]["ok"]


def test_check__effect_for_a_rejected_call__unexpected_and_i7(tmp_path: Path) -> None:
    events = _events()
    rejected_op = default_operation_id("t1", "r1", "c2")
    events.append({"kind": "db.effects", "receipt": "rc-x", "operation_id": rejected_op,
                   "idempotency_key": "k", "generation": 1, "at": 12.0, "effect_kind": "notice"})
    report = _check(tmp_path, events)
    assert report["counts"]["unexpected"] == 1
    assert not report["invariants"]["I7"]["ok"]


def test_check__quiet_later_than_the_bound__i2(tmp_path: Path) -> None:
    events = _events()
    _replace(events, "quiet", {}, quiet_seconds=7.5)
    report = _check(tmp_path, events)
    assert not report["invariants"]["I2"]["ok"]


def test_check__result_under_another_tool_name__i6(tmp_path: Path) -> None:
    events = _events()
    _replace(events, "db.final_results", {"call_id": "c1"}, tool_name="ledger.credit")
    assert not _check(tmp_path, events)["invariants"]["I6"]["ok"]
