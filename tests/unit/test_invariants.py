"""executor.core.invariants: each invariant holding on a clean history and
caught on a broken one. Pure: handmade records, no database.

The clean history: one request with a fenced write (reserved at generation 1,
requeued by the reconciler, succeeded at generation 2), a read, and a call
admission rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from executor.core.invariants import (
    AuditRecord,
    CallRecord,
    EffectRecord,
    OperationRecord,
    Proposal,
    ReceiptRecord,
    RefusalRecord,
    RejectedCall,
    ResultRecord,
    Violation,
    i1_more_than_one_effect,
    i2_unsettled,
    i3_stale_writes,
    i4_lost_or_invented,
    i5_illegal_trails,
    i6_one_result_per_call,
    i7_rejected_calls_ran,
    result_problem,
    side_effects,
)

WRITE, READ, REJECTED = "op_write", "op_read", "op_rejected"
OPERATIONS = [
    OperationRecord(WRITE, "r1", "c0", "ledger.transfer", "write", "succeeded", 2),
    OperationRecord(READ, "r1", "c1", "ledger.get_balance", "read", "succeeded", 1),
]
AUDIT = [
    AuditRecord(1, WRITE, None, "queued", 0, 10.0),
    AuditRecord(2, WRITE, "queued", "started", 1, 11.0),
    AuditRecord(3, WRITE, "started", "queued", 1, 14.0),
    AuditRecord(4, WRITE, "queued", "started", 2, 15.0),
    AuditRecord(5, WRITE, "started", "succeeded", 2, 16.0),
    AuditRecord(6, READ, None, "queued", 0, 10.0),
    AuditRecord(7, READ, "queued", "started", 1, 16.5),
    AuditRecord(8, READ, "started", "succeeded", 1, 17.0),
]
RECEIPTS = [ReceiptRecord(WRITE, 2, "rc-1", True, 15.9)]
EFFECTS = [EffectRecord(WRITE, "rc-1", 2, 15.8, "transfer", fenced=True)]
CALLS = [CallRecord("r1", "c0", WRITE), CallRecord("r1", "c1", READ), CallRecord("r1", "c2", None)]
PROPOSALS = [
    Proposal("r1", "c0", "ledger.transfer"),
    Proposal("r1", "c1", "ledger.get_balance"),
    Proposal("r1", "c2", "ledger.nope"),
]
RESULTS = [
    ResultRecord("r1", "c0", "ledger.transfer", "succeeded"),
    ResultRecord("r1", "c1", "ledger.get_balance", "succeeded"),
    ResultRecord("r1", "c2", "ledger.nope", "failed_terminal"),
]
REJECTED_CALLS = [RejectedCall("r1", "c2", REJECTED)]


def history(**changes: Any) -> dict[str, Any]:
    records: dict[str, Any] = {
        "operations": OPERATIONS, "audit": AUDIT, "receipts": RECEIPTS, "effects": EFFECTS,
        "refusals": [], "calls": CALLS, "proposals": PROPOSALS, "results": RESULTS,
        "rejected": REJECTED_CALLS,
    }
    records.update(changes)
    return records


def i1(h: dict[str, Any]) -> list[Violation]:
    return i1_more_than_one_effect(h["receipts"], h["effects"])


def i2(h: dict[str, Any]) -> list[Violation]:
    return i2_unsettled(h["operations"])


def i3(h: dict[str, Any]) -> list[Violation]:
    return i3_stale_writes(h["audit"], h["effects"], h["refusals"], h["receipts"]).violations


def i4(h: dict[str, Any]) -> list[Violation]:
    return i4_lost_or_invented(
        proposals=h["proposals"], admitted=(), calls=h["calls"], operations=h["operations"],
        effects=h["effects"], rejected=h["rejected"], every_request_answered=True,
    ).violations


def i5(h: dict[str, Any]) -> list[Violation]:
    return i5_illegal_trails(h["operations"], h["audit"])


def i6(h: dict[str, Any]) -> list[Violation]:
    return i6_one_result_per_call(h["proposals"], h["results"], quiet=True)


def i7(h: dict[str, Any]) -> list[Violation]:
    return i7_rejected_calls_ran(
        h["rejected"], operations={o.operation_id for o in h["operations"]}, audit=h["audit"],
        receipts=h["receipts"], effects=h["effects"],
    )


CHECKS: dict[str, Callable[[dict[str, Any]], list[Violation]]] = {
    "I1": i1, "I2": i2, "I3": i3, "I4": i4, "I5": i5, "I6": i6, "I7": i7,
}


@pytest.mark.parametrize("invariant", sorted(CHECKS))
def test_clean_history__every_invariant_holds(invariant: str) -> None:
    assert CHECKS[invariant](history()) == []


def _op(operation_id: str, **changes: Any) -> list[OperationRecord]:
    return [replace(o, **changes) if o.operation_id == operation_id else o for o in OPERATIONS]


def _audit(event_id: int, **changes: Any) -> list[AuditRecord]:
    return [replace(e, **changes) if e.event_id == event_id else e for e in AUDIT]


VIOLATIONS: list[tuple[str, str, dict[str, Any], Violation]] = [
    ("i1__second_receipt_from_the_ledger__two_effects", "I1",
     {"effects": [*EFFECTS, EffectRecord(WRITE, "rc-2", 1, 17.0, "transfer", fenced=True)]},
     Violation(WRITE, "2 effects")),
    ("i1__parties_disagree_on_the_receipt__two_effects", "I1",
     {"receipts": [ReceiptRecord(WRITE, 2, "rc-other", True, 15.9)]},
     Violation(WRITE, "2 effects")),
    ("i1__ledger_records_one_receipt_twice__two_effects", "I1",
     {"effects": [*EFFECTS, *EFFECTS]}, Violation(WRITE, "2 effects")),
    ("i2__operation_still_queued__reported", "I2",
     {"operations": _op(READ, state="queued")}, Violation(READ, "not settled: queued")),
    ("i3__completion_by_an_older_generation__reported", "I3",
     {"audit": _audit(5, generation=1)},
     Violation(WRITE, "succeeded recorded for generation 1 after 2 was reserved")),
    ("i3__fenced_downstream_accepts_a_token_it_had_refused__reported", "I3",
     {"effects": [replace(EFFECTS[0], generation=1, at=15.95)],
      "refusals": [RefusalRecord(WRITE, 2, 15.5)]},
     Violation(WRITE, "transfer accepted token 1 after 2")),
    ("i4__admitted_operation_has_no_row__lost", "I4",
     {"operations": [OPERATIONS[1]], "audit": AUDIT[5:]}, Violation(WRITE, "no operation row")),
    ("i4__succeeded_write_without_effect__lost", "I4",
     {"effects": []}, Violation(WRITE, "succeeded write without an accepted effect")),
    ("i4__proposal_never_recorded__lost", "I4",
     {"proposals": [*PROPOSALS, Proposal("r1", "c3", "ledger.credit")]},
     Violation("r1/c3", "proposal never recorded")),
    ("i4__operation_nobody_admitted__invented", "I4",
     {"calls": [CALLS[0], CallRecord("r1", "c1", None), CALLS[2]]},
     Violation(READ, "operation nobody admitted")),
    ("i4__effect_for_a_rejected_call__invented", "I4",
     {"effects": [*EFFECTS, EffectRecord(REJECTED, "rc-x", 1, 12.0, "notice", fenced=False)]},
     Violation(REJECTED, "effect for a rejected call")),
    ("i5__generation_goes_down__trail_reported", "I5",
     {"audit": _audit(5, generation=1), "operations": _op(WRITE, generation=1)},
     Violation(WRITE, "generation went back 2 -> 1")),
    ("i5__illegal_transition__trail_reported", "I5",
     {"audit": _audit(8, from_state="queued")}, Violation(READ, "illegal queued -> succeeded")),
    ("i5__row_state_differs_from_trail__reported", "I5",
     {"operations": _op(READ, state="failed_terminal")},
     Violation(READ, "audit ends in succeeded, row says failed_terminal")),
    ("i5__operation_without_audit__reported", "I5",
     {"audit": AUDIT[:5]}, Violation(READ, "no audit trail, row says succeeded")),
    ("i6__result_under_another_tool_name__reported", "I6",
     {"results": [RESULTS[0], replace(RESULTS[1], tool_name="ledger.credit"), RESULTS[2]]},
     Violation("r1/c1", "result names ledger.credit, call was ledger.get_balance")),
    ("i6__call_without_result__reported", "I6",
     {"results": RESULTS[:2]}, Violation("r1/c2", "0 results")),
    ("i6__waiting_for_approval_once_quiet__reported", "I6",
     {"results": [RESULTS[0], replace(RESULTS[1], status="pending", state="pending_approval"),
                  RESULTS[2]]},
     Violation("r1/c1", "no terminal result (pending_approval)")),
    ("i6__results_out_of_proposal_order__reported", "I6",
     {"results": [RESULTS[1], RESULTS[0], RESULTS[2]]},
     Violation("r1", "results out of proposal order")),
    ("i7__rejected_call_has_an_audit_event__reported", "I7",
     {"audit": [*AUDIT, AuditRecord(9, REJECTED, None, "queued", 0, 12.0)]},
     Violation(REJECTED, "rejected call r1/c2 reached it")),
]


@pytest.mark.parametrize(
    ("invariant", "changes", "expected"),
    [(invariant, changes, expected) for _, invariant, changes, expected in VIOLATIONS],
    ids=[name for name, *_ in VIOLATIONS],
)
def test_broken_history__violation_named(
    invariant: str, changes: dict[str, Any], expected: Violation
) -> None:
    assert expected in CHECKS[invariant](history(**changes))


def test_i1__same_receipt_from_worker_and_reconciler__one_effect() -> None:
    twice = [*RECEIPTS, replace(RECEIPTS[0], generation=2, recorded_at=20.0)]
    assert side_effects(twice, EFFECTS) == {WRITE: 1}
    assert i1_more_than_one_effect(twice, EFFECTS) == []


def test_i1__stale_owner_receipt_refused__not_counted() -> None:
    stale = [*RECEIPTS, ReceiptRecord(WRITE, 1, "rc-stale", False, 16.0)]
    assert i1_more_than_one_effect(stale) == []


def test_i3__unfenced_downstream_accepts_an_older_generation__counted_not_a_violation() -> None:
    late_credit = [EffectRecord(WRITE, "rc-1", 1, 15.5, "credit", fenced=False)]
    stale = i3_stale_writes(AUDIT, late_credit, [], RECEIPTS)
    assert stale.violations == []
    assert stale.late_unfenced == {"credit": 1}
    assert stale.exits_from_started == 3


def test_i3__fenced_effect_before_the_newer_token_reached_the_ledger__holds() -> None:
    # Generation 2 was reserved at 15.0, but the ledger saw generation 1's write first.
    early = [EffectRecord(WRITE, "rc-1", 1, 15.2, "transfer", fenced=True)]
    receipts = [ReceiptRecord(WRITE, 2, "rc-1", True, 15.9)]
    assert i3_stale_writes(AUDIT, early, [], receipts).violations == []


def test_i4__unproposed_call_row__invented_only_when_every_request_was_answered() -> None:
    calls = [*CALLS, CallRecord("r9", "c0", None)]

    def invented(answered: bool) -> list[Violation]:
        return i4_lost_or_invented(
            proposals=PROPOSALS, admitted=(), calls=calls, operations=OPERATIONS, effects=EFFECTS,
            rejected=REJECTED_CALLS, every_request_answered=answered,
        ).invented

    assert invented(True) == [Violation("r9/c0", "call nobody proposed")]
    assert invented(False) == []


def test_i6__reconciliation_pending_once_quiet__a_terminal_result() -> None:
    pending = ResultRecord("r1", "c0", "ledger.transfer", "pending", "reconciliation_pending")
    assert result_problem("ledger.transfer", [pending], quiet=True) is None


def test_i6__call_in_flight_on_a_live_system__not_a_violation() -> None:
    running = ResultRecord("r1", "c0", "ledger.transfer", "pending", "started")
    assert result_problem("ledger.transfer", [running], quiet=False) is None
    assert result_problem("ledger.transfer", [running], quiet=True) == "no terminal result (started)"


def test_i6__two_results_for_one_call__reported() -> None:
    assert result_problem("ledger.transfer", [RESULTS[0], RESULTS[0]], quiet=True) == "2 results"
