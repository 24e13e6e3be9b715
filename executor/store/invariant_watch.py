"""I1 and I3–I7 over a window, judged incrementally: what the exporter serves.

`toolfence check --since W` judges every operation and call touched within the
window W, so each run costs O(the window's operations). The exporter needs the
same counts all the time, and at 100 operations a second an hour's window is
360,000 operations, minutes of work: judging the whole window on every scrape
would make every scrape time out. So the exporter keeps what it found
(decision 0210,
docs/decisions/0210-toolfence-check-judges-the-operations-touched-in-a-window-a-chunk-at-a-time.md):

- The **first pass** (after every start of the exporter) judges the whole window,
  as `toolfence check --since W` does.
- **Every later pass** judges only what was touched since the previous pass
  began, less `MARGIN_SECONDS` (a session whose timestamp was read before that
  pass's snapshot may have committed after it), with the same code
  (`executor.store.invariant_check`): a touched operation on all its records, a
  call written since. A rejected call of the window is judged again when the
  operation id it would have had is touched (I7: its handler ran late).
- **What it keeps**: per invariant, the violating subjects (operation ids; I6: call
  labels) with the moment each was last touched (`latest_touches`; a call: when
  it was written). A subject judged again and found holding is dropped; one
  touched before the window's start drops out. A count is the subjects left,
  which is what `toolfence check --since W` counts at that moment.
- **I2** is not here: it is a present condition (the operations overdue now),
  counted by every scrape (`executor.store.invariant_reader.stuck_queries`).

A write that is no touch (an UPDATE of a terminal operation with no audit event)
is judged by `toolfence check` on its next run but by a pass only when the
operation is next touched. Memory: the violations found, and the window's
rejected calls (their would-be operation ids), never the window's operations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, select

from executor.core.invariants import RejectedCall, Violation
from executor.store.clock import db_now
from executor.store.invariant_check import (
    INVARIANTS,
    OPERATION_INVARIANTS,
    call_label,
    judge_calls,
    judge_operations,
    judge_rejected,
    rejected_calls,
)
from executor.store.invariant_reader import CHUNK, call_chunks, latest_touches, operation_chunks, traces

MARGIN_SECONDS = 60.0
"""How far before the previous pass's start a pass reads: a session's timestamps are
read from the clock before it commits, so a row stamped just before a pass's
snapshot may become visible only after it (the reader's own audit margin,
`CLOCK_SKEW_SECONDS`, is another minute on top)."""

WATCHED = tuple(code for code in INVARIANTS if code != "I2")
"""The invariants a pass judges (I2 is counted by every scrape)."""


@dataclass(frozen=True)
class PassResult:
    """What one pass did, and the counts after it."""

    now: float
    """The database clock when the pass began (its snapshot)."""
    since: float
    """What it read from: the window's start on a first pass."""
    first: bool
    operations: int
    """Operations judged."""
    calls: int
    """Calls judged."""
    violations: Mapping[str, int]
    """Per invariant of `WATCHED`: subjects violating it, touched within the window."""


class _Found:
    """One pass's findings, applied to the watch only when the pass completes."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.violating: dict[str, dict[str, float]] = {code: {} for code in WATCHED}
        self.judged_again: dict[str, set[str]] = {code: set() for code in WATCHED}
        self.rejected: dict[str, float] = {}
        self.operations = 0
        self.calls = 0


class InvariantWatch:
    """The violations of I1 and I3–I7 within the last `window_seconds`, kept up to
    date by `run` (one pass). One thread at a time runs the passes."""

    def __init__(
        self, window_seconds: float, *, margin_seconds: float = MARGIN_SECONDS, chunk: int = CHUNK
    ) -> None:
        self._window = window_seconds
        self._margin = margin_seconds
        self._chunk = chunk
        self._previous_start: float | None = None
        self._violating: dict[str, dict[str, float]] = {code: {} for code in WATCHED}
        # The window's rejected calls: the operation id each would have had (I7), and
        # when the call was written. Only the id: a pass keeps no reasons, and an hour
        # of 100 rejections a second is 360,000 of them.
        self._rejected: dict[str, float] = {}

    @property
    def previous_start(self) -> float | None:
        """The database clock when the last completed pass began (None: no pass yet)."""
        return self._previous_start

    def violations(self) -> dict[str, set[str]]:
        """The violating subjects the last pass left, per invariant."""
        return {code: set(found) for code, found in self._violating.items()}

    def run(self, conn: Connection, *, now: float | None = None) -> PassResult:
        """One pass, in the caller's read-only transaction (one snapshot). Nothing is
        kept unless it completes: a failed pass leaves the watch as it was, and the next
        one reads from the same place. `now` (tests: a later moment) defaults to the
        database clock."""
        if now is None:
            now = float(conn.execute(select(db_now())).scalar_one())
        start = now - self._window
        first = self._previous_start is None
        since = start if self._previous_start is None else max(start, self._previous_start - self._margin)
        found = _Found(now)
        self._judge_operations(conn, since, found)
        self._judge_calls(conn, since, found)
        self._apply(found, now, start)
        return PassResult(
            now=now, since=since, first=first, operations=found.operations, calls=found.calls,
            violations={code: len(subjects) for code, subjects in self._violating.items()},
        )

    def _judge_operations(self, conn: Connection, since: float, found: _Found) -> None:
        for part in operation_chunks(conn, since, None, self._chunk):
            found.operations += len(part.operation_ids)
            verdicts = judge_operations(part.records)
            # Rejected calls of earlier passes whose would-be operation was touched since.
            again = [RejectedCall("", "", op) for op in part.operation_ids if op in self._rejected]
            for code in OPERATION_INVARIANTS:
                found.judged_again[code].update(
                    op for op in part.operation_ids if op in self._violating[code]
                )
            touched = latest_touches(
                conn, sorted({v.subject for vs in verdicts.values() for v in vs})
            )
            for code, violations in verdicts.items():
                self._keep(found, code, violations, touched)
            if again:
                self._judge_rejected(again, judge_rejected(again, part.records), found)

    def _judge_calls(self, conn: Connection, since: float, found: _Found) -> None:
        for rows in call_chunks(conn, since, self._chunk):
            found.calls += len(rows)
            written = {call_label(r): r.created_at for r in rows}
            found.judged_again["I6"].update(label for label in written if label in self._violating["I6"])
            self._keep(found, "I6", judge_calls(rows), written)
            rejected = rejected_calls(rows)
            if not rejected:
                continue
            for call, row in zip(rejected, (r for r in rows if r.operation_id is None), strict=True):
                found.rejected[call.operation_id] = row.created_at
            records = traces(conn, [r.operation_id for r in rejected], None)
            self._judge_rejected(rejected, judge_rejected(rejected, records), found)

    def _judge_rejected(
        self, rejected: list[RejectedCall], violations: list[Violation], found: _Found
    ) -> None:
        # When each call was written: this pass read it, or an earlier one did.
        ids = [call.operation_id for call in rejected]
        written = {op: found.rejected[op] if op in found.rejected else self._rejected[op] for op in ids}
        found.judged_again["I7"].update(op for op in written if op in self._violating["I7"])
        self._keep(found, "I7", violations, written)

    @staticmethod
    def _keep(found: _Found, code: str, violations: list[Violation], when: Mapping[str, float]) -> None:
        for violation in violations:
            # A subject with no touch of its own (I6: a request's order) was seen now.
            at = when.get(violation.subject, found.now)
            kept = found.violating[code]
            kept[violation.subject] = max(at, kept.get(violation.subject, at))

    def _apply(self, found: _Found, now: float, start: float) -> None:
        for code in WATCHED:
            kept = self._violating[code]
            for subject in found.judged_again[code]:
                kept.pop(subject, None)
            kept.update(found.violating[code])
            self._violating[code] = {s: at for s, at in kept.items() if at >= start}
        self._rejected.update(found.rejected)
        self._rejected = {op: at for op, at in self._rejected.items() if at >= start}
        self._previous_start = now
