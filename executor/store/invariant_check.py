"""I1–I7 on a live database: the records `invariant_reader` streams, judged by the pure
functions of `executor.core.invariants` (`toolfence check` and the exporter).

What each invariant is computed from here, and what it cannot see (the command's
help and docs/fleet.md say the same):

- I1 (≤ 1 side effect): accepted receipts per operation, with a downstream's own
  effect rows when one is given (`Downstream`); without one, an effect toolfence
  never received a receipt for is invisible.
- I2 (settled once quiet): a live system is never quiet, so operations overdue by
  the stuck threshold (`stuck_queries`), whatever the window.
- I3 (no stale write accepted): exits from `started` recorded for a generation
  older than one already reserved (the audit trail); with a downstream, fenced
  effects it accepted after a higher token. Lease renewals leave no record, and
  a downstream that does not report cannot be seen.
- I4 (nothing lost or invented): the calls table is the proposals: an admitted
  call naming no operation row or another call's, an operation no call admitted,
  a `succeeded` write with no accepted effect (a downstream effect or receipt).
  What a client sent that never reached the database cannot be seen.
- I5 (legal transitions, generation grows): each operation's whole audit trail.
- I6 (one result per call, own tool): each call row's answer, its stored result
  or its operation; terminality is I2's on a live system.
- I7 (rejected call never ran): the operation id a rejected call would have had
  (`default_operation_id`) has no operation, audit event, receipt or effect; an
  application that issues its own operation ids is checked only when it reused
  the default for the rejected call.

Counts are of subjects (operations, or calls for I6 and I7), each counted once;
the first `limit` of each invariant are kept as examples.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, select

from executor.core import invariants
from executor.core.identifiers import default_operation_id
from executor.core.states import State
from executor.store.clock import db_now
from executor.store.invariant_reader import (
    CHUNK,
    CallRow,
    Downstream,
    call_chunks,
    operation_chunks,
    stuck_chunks,
    traces,
)

TITLES = {
    "I1": "at most one side effect per operation",
    "I2": "every operation settles (none overdue)",
    "I3": "no write from a stale generation accepted",
    "I4": "no admitted call lost, no operation invented",
    "I5": "legal transitions, generation never goes down",
    "I6": "one result per call, with its own tool name",
    "I7": "a rejected call never ran",
}
INVARIANTS = tuple(TITLES)


@dataclass(frozen=True)
class Example:
    subject: str
    reason: str
    operation_id: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "operation_id": self.operation_id, "reason": self.reason}


@dataclass
class Tally:
    invariant: str
    violations: int = 0
    examples: list[Example] = field(default_factory=list)

    @property
    def title(self) -> str:
        return TITLES[self.invariant]

    def add(self, found: Iterable[invariants.Violation], limit: int, operation_of: dict[str, str]) -> None:
        """Count each subject once (its first reason is its example's)."""
        seen: set[str] = set()
        for violation in found:
            if violation.subject in seen:
                continue
            seen.add(violation.subject)
            self.violations += 1
            if len(self.examples) < limit:
                operation_id = operation_of.get(violation.subject, violation.subject)
                self.examples.append(Example(violation.subject, violation.reason, operation_id or None))


@dataclass
class CheckReport:
    """What one check found. `since` None: the whole tables."""

    now: float
    since: float | None
    stuck_after_seconds: float
    downstream: str | None
    operations: int = 0
    calls: int = 0
    tallies: dict[str, Tally] = field(default_factory=lambda: {code: Tally(code) for code in INVARIANTS})

    @property
    def ok(self) -> bool:
        return not any(t.violations for t in self.tallies.values())

    def counts(self) -> dict[str, int]:
        return {code: tally.violations for code, tally in self.tallies.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "now": self.now,
            "since": self.since,
            "stuck_after_seconds": self.stuck_after_seconds,
            "downstream": self.downstream,
            "operations_checked": self.operations,
            "calls_checked": self.calls,
            "invariants": {
                code: {
                    "title": tally.title,
                    "violations": tally.violations,
                    "examples": [example.as_dict() for example in tally.examples],
                }
                for code, tally in self.tallies.items()
            },
        }


def check(
    conn: Connection,
    *,
    since: float | None,
    stuck_after_seconds: float,
    limit: int = 5,
    downstream: Downstream | None = None,
    now: float | None = None,
    chunk: int = CHUNK,
) -> CheckReport:
    """I1–I7 over the window (`since`: epoch seconds on the database clock; None: all).

    Run it in a read-only transaction: it only reads, a chunk at a time.
    """
    if now is None:
        now = float(conn.execute(select(db_now())).scalar_one())
    report = CheckReport(now, since, stuck_after_seconds, downstream.name if downstream else None)
    tallies = report.tallies
    for part in operation_chunks(conn, since, downstream, chunk):
        report.operations += len(part.operation_ids)
        for code, found in judge_operations(part.records).items():
            tallies[code].add(found, limit, {})
    for rows in call_chunks(conn, since, chunk):
        report.calls += len(rows)
        tallies["I6"].add(judge_calls(rows), limit, {call_label(r): r.operation_id or "" for r in rows})
        rejected = rejected_calls(rows)
        if rejected:
            records = traces(conn, [r.operation_id for r in rejected], downstream)
            tallies["I7"].add(judge_rejected(rejected, records), limit, {})
    for stuck in stuck_chunks(conn, now - stuck_after_seconds, chunk):
        tallies["I2"].add(
            (invariants.Violation(v.subject, f"{v.reason}, overdue by over {stuck_after_seconds:g} s")
             for v in invariants.i2_unsettled(stuck)),
            limit, {},
        )
    return report


OPERATION_INVARIANTS = ("I1", "I3", "I4", "I5")
"""Judged per operation on all its records: each violation's subject is one of the operation ids judged."""


def judge_operations(records: invariants.Records) -> dict[str, list[invariants.Violation]]:
    """I1, I3, I4 and I5 over a chunk of operations, every record of each in `records`."""
    stale = invariants.i3_stale_writes(records.audit, records.effects, records.refusals, records.receipts)
    # A write's receipt is the downstream's id for its effect: evidence of it for I4
    # (never for I1, where a receipt seen twice must not count as two effects).
    evidence = [*records.effects, *_receipts_as_effects(records.receipts)]
    admission = invariants.i4_lost_or_invented(
        proposals=(), admitted=(), calls=records.calls, operations=records.operations,
        effects=evidence, rejected=(), every_request_answered=False, quiet=False,
    )
    return {
        "I1": invariants.i1_more_than_one_effect(records.receipts, records.effects),
        "I3": stale.violations,
        "I4": admission.violations,
        "I5": invariants.i5_illegal_trails(records.operations, records.audit),
    }


def _receipts_as_effects(found: Iterable[invariants.ReceiptRecord]) -> list[invariants.EffectRecord]:
    return [
        invariants.EffectRecord(r.operation_id, r.receipt, r.generation, r.recorded_at, "receipt", False)
        for r in found if r.accepted
    ]


def _request_key(row: CallRow) -> str:
    # Request ids are scoped by tenant: two tenants' `req-1` are two requests.
    return f"{row.tenant}:{row.request_id}" if row.tenant else row.request_id


def call_label(row: CallRow) -> str:
    """The call's subject in I6's violations (`request/call`, the request scoped by tenant)."""
    return f"{_request_key(row)}/{row.call_id}"


def _answer(row: CallRow) -> invariants.ResultRecord | None:
    """The one result a caller reads for this call row (`outbox.results`): the result
    stored at admission, else its operation's, under that operation's tool name."""
    if row.answered_at_admission:
        return invariants.ResultRecord(_request_key(row), row.call_id, row.tool_name, "failed_terminal")
    if row.operation_tool is None or row.operation_state is None:
        return None
    state = State(row.operation_state)
    status = state.value if state in (State.SUCCEEDED, State.FAILED_TERMINAL) else "pending"
    return invariants.ResultRecord(
        _request_key(row), row.call_id, row.operation_tool, status, row.operation_state
    )


def judge_calls(rows: list[CallRow]) -> list[invariants.Violation]:
    """I6 over a chunk of call rows, each with what answers it (subjects: `call_label`)."""
    proposals = [invariants.Proposal(_request_key(r), r.call_id, r.tool_name) for r in rows]
    answers = [answer for answer in map(_answer, rows) if answer is not None]
    return invariants.i6_one_result_per_call(proposals, answers, quiet=False)


def rejected_calls(rows: list[CallRow]) -> list[invariants.RejectedCall]:
    """The rejected calls among the rows, with the operation id each would have had."""
    return [
        invariants.RejectedCall(
            _request_key(r), r.call_id, default_operation_id(r.tenant, r.request_id, r.call_id)
        )
        for r in rows if r.operation_id is None
    ]


def judge_rejected(
    rejected: list[invariants.RejectedCall], found: invariants.Records
) -> list[invariants.Violation]:
    """I7: the rejected calls whose would-be operation ids have a record in `found`
    (subjects: those operation ids)."""
    return invariants.i7_rejected_calls_ran(
        rejected, operations={op.operation_id for op in found.operations}, audit=found.audit,
        receipts=found.receipts, effects=found.effects,
    )
