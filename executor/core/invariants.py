"""Invariants I1–I7 (docs/design.md §Invariants), each defined once, over plain records (pure).

The demo (its database and the ledger's tables), the chaos checker (a history
file) and the exporter (bounded queries at scrape time) each gather records
their own way and ask these functions. A function returns the violations it
found, each naming its subject (an operation id, or `request/call`) and why.

Downstream records (`EffectRecord`, `RefusalRecord`) are what a downstream says
it accepted or refused; the caller translates its own tables into them, so
nothing here knows the reference ledger. A fencing downstream keeps its highest
token per idempotency key, and toolfence issues one key per operation
(`toolfence:<operation id>`), so "per key" is "per operation" here.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from executor.core.states import SETTLED, State, is_legal


@dataclass(frozen=True, slots=True)
class OperationRecord:
    operation_id: str
    request_id: str
    call_id: str
    tool_name: str
    mode: str
    state: str
    generation: int


@dataclass(frozen=True, slots=True)
class AuditRecord:
    event_id: int
    operation_id: str
    from_state: str | None
    to_state: str
    generation: int
    at: float


@dataclass(frozen=True, slots=True)
class ReceiptRecord:
    """A receipt toolfence recorded for an operation (`accepted` False: a stale owner's)."""

    operation_id: str
    generation: int
    receipt: str
    accepted: bool
    recorded_at: float


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A row of the calls table: one per proposed call id; `operation_id` set when admitted."""

    request_id: str
    call_id: str
    operation_id: str | None


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """An effect the downstream accepted; `fenced` when it promised to refuse stale tokens."""

    operation_id: str
    receipt: str
    generation: int
    at: float
    kind: str
    fenced: bool


@dataclass(frozen=True, slots=True)
class RefusalRecord:
    """A write a fencing downstream refused for a stale token."""

    operation_id: str
    token: int
    at: float


@dataclass(frozen=True, slots=True)
class Proposal:
    """A call as the client proposed it, in proposal order within its request."""

    request_id: str
    call_id: str
    tool_name: str


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """A result as a caller reads it: `status` succeeded | failed_terminal |
    failed_retryable | pending, and for pending the operation's `state`."""

    request_id: str
    call_id: str
    tool_name: str
    status: str
    state: str | None = None

    @property
    def terminal(self) -> bool:
        # A pending call waiting for a person to reconcile it is settled (I2);
        # one waiting for approval is not: the approver has not answered yet.
        return self.status != "pending" or (self.state is not None and State(self.state) in SETTLED)


@dataclass(frozen=True, slots=True)
class RejectedCall:
    """A call admission rejected, with the operation id it would have had."""

    request_id: str
    call_id: str
    operation_id: str


@dataclass(frozen=True, slots=True)
class Violation:
    subject: str
    reason: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.reason}"


@dataclass(frozen=True)
class Records:
    """One history's records, as the demo and the chaos checker gather them."""

    operations: list[OperationRecord]
    audit: list[AuditRecord]
    receipts: list[ReceiptRecord]
    calls: list[CallRecord]
    effects: list[EffectRecord]
    refusals: list[RefusalRecord]


def _call_label(request_id: str, call_id: str) -> str:
    return f"{request_id}/{call_id}"


# ------------------------------------------------------------------ I1


def side_effects(receipts: Iterable[ReceiptRecord], effects: Iterable[EffectRecord]) -> dict[str, int]:
    """Accepted side effects per operation, by both parties' records: the distinct
    receipts in toolfence's accepted receipts and the downstream's effects together,
    or the downstream's effect rows when it recorded more rows than receipts."""
    distinct: dict[str, set[str]] = defaultdict(set)
    rows: Counter[str] = Counter()
    for receipt in receipts:
        if receipt.accepted:
            distinct[receipt.operation_id].add(receipt.receipt)
    for effect in effects:
        distinct[effect.operation_id].add(effect.receipt)
        rows[effect.operation_id] += 1
    return {op: max(len(seen), rows[op]) for op, seen in distinct.items()}


def i1_more_than_one_effect(
    receipts: Iterable[ReceiptRecord], effects: Iterable[EffectRecord] = ()
) -> list[Violation]:
    """I1: operations with more than one accepted side effect."""
    return [
        Violation(op, f"{count} effects")
        for op, count in sorted(side_effects(receipts, effects).items())
        if count > 1
    ]


# ------------------------------------------------------------------ I2


def i2_unsettled(operations: Iterable[OperationRecord]) -> list[Violation]:
    """I2, once quiet: operations neither terminal nor `reconciliation_pending`."""
    return [
        Violation(op.operation_id, f"not settled: {op.state}")
        for op in operations
        if State(op.state) not in SETTLED
    ]


# ------------------------------------------------------------------ I3


@dataclass(frozen=True)
class StaleWrites:
    violations: list[Violation]
    # Exits from `started` checked against the newest generation handed out.
    exits_from_started: int
    # Effects a non-fencing downstream accepted from a generation older than one
    # already reserved, by kind: not a violation (such a downstream promises to
    # dedupe, not to fence; I1 judges it), reported so a duplicate can be traced.
    late_unfenced: Counter[str]


def _trails(audit: Iterable[AuditRecord]) -> dict[str, list[AuditRecord]]:
    trails: dict[str, list[AuditRecord]] = defaultdict(list)
    for event in sorted(audit, key=lambda e: e.event_id):
        trails[event.operation_id].append(event)
    return trails


def i3_stale_writes(
    audit: Iterable[AuditRecord],
    effects: Iterable[EffectRecord],
    refusals: Iterable[RefusalRecord],
    receipts: Iterable[ReceiptRecord],
) -> StaleWrites:
    """I3: a write accepted from a stale generation.

    - completion: an exit from `started` recorded for a generation older than one
      already reserved for the operation;
    - fencing downstream: an effect it accepted with a token lower than one it had
      already seen for the key, from its effects, its refusals, or receipts
      toolfence recorded (each recorded after the downstream answered that token).
    """
    effects = list(effects)
    violations: list[Violation] = []
    exits = 0
    reserved: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for operation_id, trail in _trails(audit).items():
        highest = 0
        for event in trail:
            if event.from_state == State.STARTED.value:
                exits += 1
                if event.generation < highest:
                    violations.append(Violation(
                        operation_id,
                        f"{event.to_state} recorded for generation {event.generation} "
                        f"after {highest} was reserved",
                    ))
            if event.to_state == State.STARTED.value:
                highest = max(highest, event.generation)
                reserved[operation_id].append((event.at, event.generation))

    seen_tokens: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for effect in effects:
        if effect.fenced:
            seen_tokens[effect.operation_id].append((effect.at, effect.generation))
    for refusal in refusals:
        seen_tokens[refusal.operation_id].append((refusal.at, refusal.token))
    for receipt in receipts:
        if receipt.accepted:
            seen_tokens[receipt.operation_id].append((receipt.recorded_at, receipt.generation))
    late_unfenced: Counter[str] = Counter()
    for effect in effects:
        if effect.fenced:
            earlier = [token for at, token in seen_tokens[effect.operation_id] if at < effect.at]
            if earlier and max(earlier) > effect.generation:
                violations.append(Violation(
                    effect.operation_id,
                    f"{effect.kind} accepted token {effect.generation} after {max(earlier)}",
                ))
        elif any(
            at < effect.at and generation > effect.generation
            for at, generation in reserved.get(effect.operation_id, ())
        ):
            late_unfenced[effect.kind] += 1
    return StaleWrites(violations, exits, late_unfenced)


# ------------------------------------------------------------------ I4


@dataclass(frozen=True)
class Admissions:
    lost: list[Violation]
    invented: list[Violation]

    @property
    def violations(self) -> list[Violation]:
        return self.lost + self.invented


def i4_lost_or_invented(
    *,
    proposals: Iterable[Proposal],
    admitted: Iterable[str],
    calls: Iterable[CallRecord],
    operations: Iterable[OperationRecord],
    effects: Iterable[EffectRecord],
    rejected: Iterable[RejectedCall],
    every_request_answered: bool,
    quiet: bool = True,
) -> Admissions:
    """I4: no admitted proposal lost, no operation that was not admitted.

    `proposals` are the calls the client was answered for and `admitted` the
    operation ids it was told were admitted; a call row naming an operation counts
    as an admission too (the calls table is the producer's own truth). With
    `every_request_answered` the client heard back from every request it sent,
    so a call row it never proposed was invented; a client that gave up on a
    request whose commit it could not confirm passes False.

    Lost: a proposal with no call row; an admitted operation with no row, no call
    row, a row of another call, not settled once quiet, or `succeeded` as a write
    with no accepted downstream effect (the caller was told it happened).
    Invented: an operation nobody admitted; an effect for a rejected call or for
    an operation nobody admitted; (see above) a call nobody proposed.

    A live system (`toolfence check`, the exporter) passes quiet=False: operations
    in flight are normal there, and overdue ones are I2's stuck operations.
    """
    proposals = list(proposals)
    calls = list(calls)
    ops = {op.operation_id: op for op in operations}
    effect_ops = {effect.operation_id for effect in effects}
    recorded = {(c.request_id, c.call_id) for c in calls}
    call_of = {c.operation_id: c for c in calls if c.operation_id is not None}
    admitted_ops = set(admitted) | set(call_of)

    lost: dict[str, str] = {}
    for proposal in proposals:
        if (proposal.request_id, proposal.call_id) not in recorded:
            lost[_call_label(proposal.request_id, proposal.call_id)] = "proposal never recorded"
    for operation_id in sorted(admitted_ops):
        row = ops.get(operation_id)
        call = call_of.get(operation_id)
        if row is None:
            lost[operation_id] = "no operation row"
        elif call is None:
            lost[operation_id] = "no call row"
        elif (row.request_id, row.call_id) != (call.request_id, call.call_id):
            lost[operation_id] = f"row of call {_call_label(row.request_id, row.call_id)}"
        elif quiet and State(row.state) not in SETTLED:
            lost[operation_id] = f"not settled: {row.state}"
    for row in ops.values():
        if row.mode == "write" and row.state == State.SUCCEEDED.value and row.operation_id not in effect_ops:
            lost.setdefault(row.operation_id, "succeeded write without an accepted effect")

    invented: dict[str, str] = {}
    if every_request_answered:
        proposed = {(p.request_id, p.call_id) for p in proposals}
        for call in calls:
            if (call.request_id, call.call_id) not in proposed:
                invented[_call_label(call.request_id, call.call_id)] = "call nobody proposed"
    for operation_id in ops:
        if operation_id not in admitted_ops:
            invented[operation_id] = "operation nobody admitted"
    rejected_ops = {r.operation_id for r in rejected}
    for operation_id in effect_ops:
        if operation_id in rejected_ops:
            invented[operation_id] = "effect for a rejected call"
        elif operation_id not in ops or operation_id not in admitted_ops:
            invented[operation_id] = "effect for an operation nobody admitted"
    return Admissions(
        lost=[Violation(s, why) for s, why in sorted(lost.items())],
        invented=[Violation(s, why) for s, why in sorted(invented.items())],
    )


# ------------------------------------------------------------------ I5


def i5_illegal_trails(
    operations: Iterable[OperationRecord], audit: Iterable[AuditRecord]
) -> list[Violation]:
    """I5: each operation's audit trail is a chain of legal transitions with a
    generation that never goes down, ending in the row's state and generation."""
    ops = {op.operation_id: op for op in operations}
    trails = _trails(audit)
    violations: list[Violation] = []
    for operation_id in sorted(set(ops) | set(trails)):
        row = ops.get(operation_id)
        trail = trails.get(operation_id, [])
        if row is None:
            violations.append(Violation(operation_id, "audit trail of an operation with no row"))
            continue
        if not trail:
            violations.append(Violation(operation_id, f"no audit trail, row says {row.state}"))
            continue
        previous: str | None = None
        highest = 0
        for event in trail:
            if event.from_state != previous:
                violations.append(Violation(
                    operation_id,
                    f"event {event.event_id} from {event.from_state} but the operation was {previous}",
                ))
            if not is_legal(event.from_state, event.to_state):
                violations.append(Violation(
                    operation_id, f"illegal {event.from_state} -> {event.to_state}"
                ))
            if event.generation < highest:
                violations.append(Violation(
                    operation_id, f"generation went back {highest} -> {event.generation}"
                ))
            highest = max(highest, event.generation)
            previous = event.to_state
        if previous != row.state:
            violations.append(Violation(operation_id, f"audit ends in {previous}, row says {row.state}"))
        if row.generation != highest:
            violations.append(Violation(
                operation_id, f"row generation {row.generation} != audit {highest}"
            ))
    return violations


# ------------------------------------------------------------------ I6


def result_problem(
    tool_name: str, results: Sequence[ResultRecord], *, quiet: bool
) -> str | None:
    """What is wrong with the results of one proposed call of `tool_name`, or None.

    Exactly one result, carrying the call's own tool name; once `quiet`, a terminal
    one. A live system (the exporter) passes quiet=False: calls in flight are
    normal there, and overdue ones are I2's stuck operations.
    """
    if len(results) != 1:
        return f"{len(results)} results"
    (result,) = results
    if result.tool_name != tool_name:
        return f"result names {result.tool_name}, call was {tool_name}"
    if quiet and not result.terminal:
        return f"no terminal result ({result.state})"
    return None


def i6_one_result_per_call(
    proposals: Iterable[Proposal], results: Iterable[ResultRecord], *, quiet: bool
) -> list[Violation]:
    """I6: every proposed call has exactly one result with its own tool name
    (terminal once quiet), a request's results come in proposal order, and no
    result answers a call nobody proposed."""
    proposals = list(proposals)
    by_call: dict[tuple[str, str], list[ResultRecord]] = defaultdict(list)
    order: dict[str, list[str]] = defaultdict(list)
    for result in results:
        by_call[(result.request_id, result.call_id)].append(result)
        order[result.request_id].append(result.call_id)
    violations: list[Violation] = []
    proposed_order: dict[str, list[str]] = defaultdict(list)
    for proposal in proposals:
        proposed_order[proposal.request_id].append(proposal.call_id)
        problem = result_problem(
            proposal.tool_name, by_call.get((proposal.request_id, proposal.call_id), []), quiet=quiet
        )
        if problem is not None:
            violations.append(Violation(_call_label(proposal.request_id, proposal.call_id), problem))
    for request_id, call_ids in proposed_order.items():
        got = order.get(request_id, [])
        if sorted(got) == sorted(call_ids) and got != call_ids:
            violations.append(Violation(request_id, "results out of proposal order"))
    proposed = {(p.request_id, p.call_id) for p in proposals}
    for request_id, call_id in by_call:
        if (request_id, call_id) not in proposed:
            violations.append(
                Violation(_call_label(request_id, call_id), "a result for a call nobody proposed")
            )
    return violations


# ------------------------------------------------------------------ I7


def i7_rejected_calls_ran(
    rejected: Iterable[RejectedCall],
    *,
    operations: Collection[str],
    audit: Iterable[AuditRecord],
    receipts: Iterable[ReceiptRecord],
    effects: Iterable[EffectRecord],
) -> list[Violation]:
    """I7: a rejected call left no trace of running: no operation under the id it
    would have had, no audit event, receipt or downstream effect for it."""
    traced = (
        set(operations)
        | {e.operation_id for e in audit}
        | {r.operation_id for r in receipts}
        | {e.operation_id for e in effects}
    )
    return [
        Violation(r.operation_id, f"rejected call {_call_label(r.request_id, r.call_id)} reached it")
        for r in rejected
        if r.operation_id in traced
    ]
