"""The evidence: figures and invariants I1–I7 from the database and the ledger, as tables."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine, select

from executor.cli.demo.place import Place
from executor.cli.demo.workload import DemoRequest
from executor.core import invariants
from executor.core.admission import Gate
from executor.core.states import SETTLED, State
from executor.core.tools import Mode
from executor.core.types import Succeeded
from executor.store.engine import read_only
from executor.store.schema import audit_events, calls, operations, receipts

# The ledger's effects that refuse a stale fencing token (`transfer`, effect `fenced`).
FENCED_EFFECT_KINDS = frozenset({"transfer"})

# The audit decision suffix of a refusal by the worker's re-check (executor/worker/runner.py).
AT_EXECUTION = "_at_execution"


@dataclass(frozen=True)
class Check:
    code: str
    title: str
    passed: bool
    evidence: str


@dataclass
class Figures:
    states: Counter[str] = field(default_factory=Counter)
    failed_codes: Counter[str] = field(default_factory=Counter)
    pending_tools: Counter[str] = field(default_factory=Counter)
    gates: Counter[str] = field(default_factory=Counter)
    gate_codes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    reused: int = 0  # repeated writes answered from the earlier call's operation
    # Refused by the worker's re-check just before running (audit `<code>_at_execution`).
    refused_at_execution: Counter[str] = field(default_factory=Counter)
    writes: int = 0
    ledger_effects: Counter[int] = field(default_factory=Counter)  # effects per write → ops
    receipt_effects: Counter[int] = field(default_factory=Counter)
    ledger_only: int = 0
    fenced_refusals: int = 0
    takeovers_by_worker: int = 0
    requeued_by_reconciler: int = 0
    lookups_resolved: int = 0
    stale_counters: Mapping[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def all_passed(self) -> bool:
        return all(c.passed for c in self.checks)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _examples(items: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def gather(engine: Engine, requests: Sequence[DemoRequest], metrics_dir: Path | None) -> Figures:
    """Every figure and invariant, from the database and the ledger's own tables."""
    from ledger.service import effects, fenced_writes
    from outbox.producer import default_operation_id
    from outbox.results import results

    figures = Figures()
    reader = read_only(engine)
    with reader.connect() as conn:
        ops = {r.operation_id: r for r in conn.execute(select(operations))}
        call_rows = list(conn.execute(select(calls)))
        events = list(conn.execute(select(audit_events).order_by(audit_events.c.event_id)))
        receipt_rows = list(conn.execute(select(receipts)))
        effect_rows = list(conn.execute(select(effects)))
        fenced_rows = list(conn.execute(select(fenced_writes)))

    # ---- figures
    for op in ops.values():
        figures.states[op.state] += 1
        if op.state == State.FAILED_TERMINAL.value:
            figures.failed_codes[op.error_code or "?"] += 1
        if op.state == State.RECONCILIATION_PENDING.value:
            figures.pending_tools[op.tool_name] += 1
    for row in call_rows:
        if row.reused_from_call_id is not None and row.result is None:
            figures.reused += 1
        if row.result is not None:
            gate = row.gate or "?"
            figures.gates[gate] += 1
            figures.gate_codes[gate][json.loads(row.result).get("error", {}).get("code", "?")] += 1
    rules = _records(ops.values(), call_rows, events, receipt_rows, effect_rows, fenced_rows)
    # Side effects per write, by each party's records alone (I1 judges them together).
    by_ledger = invariants.side_effects((), rules.effects)
    by_toolfence = invariants.side_effects(rules.receipts, ())
    write_ops = [op for op in ops.values() if op.mode == Mode.WRITE]
    figures.writes = len(write_ops)
    for op in write_ops:
        figures.ledger_effects[by_ledger.get(op.operation_id, 0)] += 1
        figures.receipt_effects[by_toolfence.get(op.operation_id, 0)] += 1
        if by_ledger.get(op.operation_id) and not by_toolfence.get(op.operation_id):
            figures.ledger_only += 1
    figures.fenced_refusals = len(fenced_rows)
    decisions = Counter(e.decision_code for e in events)
    figures.takeovers_by_worker = decisions["lease_takeover"]
    figures.requeued_by_reconciler = decisions["requeued_stale"]
    figures.lookups_resolved = decisions["lookup_done"]
    for decision, count in decisions.items():
        if decision.endswith(AT_EXECUTION):
            figures.refused_at_execution[decision.removesuffix(AT_EXECUTION)] += count
    figures.stale_counters = _stale_counters(metrics_dir)

    proposals = [
        invariants.Proposal(r.request_id, c.call_id, c.tool_name) for r in requests for c in r.calls
    ]

    # ---- I1: at most one side effect per operation, in either party's records
    effects_per_op = invariants.side_effects(rules.receipts, rules.effects)
    over = [v.subject for v in invariants.i1_more_than_one_effect(rules.receipts, rules.effects)]
    most = max(effects_per_op.values(), default=0)
    figures.checks.append(Check(
        "I1", "≤ 1 side effect per operation", not over,
        f"max {most} distinct receipt per operation (ledger records ∪ toolfence receipts)"
        if not over else f"{len(over)} operations with more: {_examples(over)}",
    ))

    # ---- I2: quiet → terminal or reconciliation_pending
    unsettled = [v.subject for v in invariants.i2_unsettled(rules.operations)]
    figures.checks.append(Check(
        "I2", "everything settled once quiet", not unsettled,
        f"{len(ops)} of {len(ops)} operations terminal or reconciliation_pending" if not unsettled
        else f"{len(unsettled)} still moving: {_examples(unsettled)}",
    ))

    # ---- I3: no write from a stale generation accepted
    stale = invariants.i3_stale_writes(rules.audit, rules.effects, rules.refusals, rules.receipts)
    i3_bad = [str(v) for v in stale.violations]
    figures.checks.append(Check(
        "I3", "no stale write accepted", not i3_bad,
        f"{sum(e.fenced for e in rules.effects)} fenced ledger effects, none with a token below one "
        "the ledger had seen; "
        f"{stale.exits_from_started} exits from started by the current generation; "
        f"{len(fenced_rows)} stale token{'s' if len(fenced_rows) != 1 else ''} refused, none accepted"
        if not i3_bad else f"{len(i3_bad)} stale writes accepted: {_examples(i3_bad)}",
    ))

    # ---- I4: no admitted proposal lost; no operation that was not admitted
    rejected = [
        invariants.RejectedCall(
            row.request_id, row.call_id, default_operation_id(row.tenant, row.request_id, row.call_id)
        )
        for row in call_rows if row.operation_id is None
    ]
    # The demo heard back from every request it sent: a call row it did not propose was invented.
    admission = invariants.i4_lost_or_invented(
        proposals=proposals, admitted=(), calls=rules.calls, operations=rules.operations,
        effects=rules.effects, rejected=rejected, every_request_answered=True,
    )
    admitted = [row for row in call_rows if row.operation_id is not None and row.reused_from_call_id is None]
    figures.checks.append(Check(
        "I4", "no proposal lost or invented", not admission.violations,
        f"{len(proposals)} proposals recorded; {len(admitted)} admitted = {len(ops)} operations"
        if not admission.violations else
        f"{len(admission.lost)} lost, {len(admission.invented)} invented: "
        f"{_examples([str(v) for v in admission.violations])}",
    ))

    # ---- I5: legal transitions, consistent trail, monotonic generation
    bad_trails = sorted({v.subject for v in invariants.i5_illegal_trails(rules.operations, rules.audit)})
    traced = {e.operation_id for e in events}
    figures.checks.append(Check(
        "I5", "legal transitions, generation grows", not bad_trails,
        f"{len(events)} audit events over {len(traced)} operations, each trail legal and "
        "ending in the operation's state and generation"
        if not bad_trails else f"{len(bad_trails)} bad trails: {_examples(bad_trails)}",
    ))

    # ---- I6: one terminal result per call id, with its own tool name
    answers = [
        invariants.ResultRecord(
            request.request_id, status.call_id, status.tool_name, status.status,
            getattr(status, "state", None),
        )
        for request in requests
        for status in results(engine, request.context)
    ]
    wrong = [v.subject for v in invariants.i6_one_result_per_call(proposals, answers, quiet=True)]
    figures.checks.append(Check(
        "I6", "one result per call id", not wrong,
        f"{len(proposals)} calls in {len(requests)} requests: one terminal result each, in proposal "
        "order, with its own tool name"
        if not wrong else f"{len(wrong)} wrong: {_examples(wrong)}",
    ))

    # ---- I7: a rejected call invoked its handler zero times
    ran = [
        v.subject for v in invariants.i7_rejected_calls_ran(
            rejected, operations=ops, audit=rules.audit, receipts=rules.receipts, effects=rules.effects,
        )
    ]
    figures.checks.append(Check(
        "I7", "rejected calls never ran", not ran,
        f"{len(rejected)} rejected calls: no operation, audit event, receipt or ledger effect"
        if not ran else f"{len(ran)} rejected calls left traces: {_examples(sorted(ran))}",
    ))
    return figures


def _records(
    ops: Iterable[Any], call_rows: Iterable[Any], events: Iterable[Any], receipt_rows: Iterable[Any],
    effect_rows: Iterable[Any], fenced_rows: Iterable[Any],
) -> invariants.Records:
    """The database's and the ledger's rows as the records the invariants judge."""
    return invariants.Records(
        operations=[
            invariants.OperationRecord(
                o.operation_id, o.request_id, o.call_id, o.tool_name, o.mode, o.state, int(o.generation)
            )
            for o in ops
        ],
        audit=[
            invariants.AuditRecord(
                int(e.event_id), e.operation_id, e.from_state, e.to_state, int(e.generation), float(e.at)
            )
            for e in events
        ],
        receipts=[
            invariants.ReceiptRecord(
                r.operation_id, int(r.generation), r.receipt, bool(r.accepted), float(r.recorded_at)
            )
            for r in receipt_rows
        ],
        # A repeat answered from an earlier call points at that call's operation; the
        # operation was admitted by the earlier call, so the repeat is no admission.
        calls=[
            invariants.CallRecord(
                c.request_id, c.call_id, None if c.reused_from_call_id is not None else c.operation_id
            )
            for c in call_rows
        ],
        effects=[
            invariants.EffectRecord(
                e.operation_id, e.receipt, int(e.generation), float(e.at), e.kind,
                fenced=e.kind in FENCED_EFFECT_KINDS,
            )
            for e in effect_rows
        ],
        refusals=[
            invariants.RefusalRecord(f.operation_id, int(f.token), float(f.at)) for f in fenced_rows
        ],
    )


def _stale_counters(metrics_dir: Path | None) -> dict[str, float]:
    """toolfence_stale_writes_fenced_total by stage, summed over the workers' metric files."""
    if metrics_dir is None or not metrics_dir.is_dir():
        return {}
    try:
        from prometheus_client import CollectorRegistry

        from executor.telemetry.exporter import MultiprocessTreeCollector

        registry = CollectorRegistry()
        registry.register(MultiprocessTreeCollector(str(metrics_dir)))
        totals: dict[str, float] = {}
        for family in registry.collect():
            if family.name != "toolfence_stale_writes_fenced":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    stage = sample.labels.get("stage", "?")
                    totals[stage] = totals.get(stage, 0.0) + sample.value
        return totals
    except Exception:
        return {}


# ---------------------------------------------------------------------- the tables


def model_view(engine: Engine, request: DemoRequest) -> Table:
    """One request's results as a model receives them: one per call id, in proposal order."""
    from outbox.results import final, results

    table = Table(title=f"What the model gets back for {request.request_id}", title_justify="left")
    for header in ("call id", "tool", "result", "detail"):
        table.add_column(header, overflow="fold")
    for proposal, status in zip(request.calls, results(engine, request.context), strict=False):
        outcome = final(status)
        if isinstance(outcome, Succeeded):
            detail = json.dumps(outcome.output, separators=(", ", ": "))
            verdict = Text("succeeded", style="green")
        else:
            paths = ", ".join(f"{d.path or '(root)'}: {d.code}" for d in outcome.error.details)
            detail = f"{outcome.error.code.value}" + (f" ({paths})" if paths else "")
            verdict = Text(outcome.status, style="red")
        table.add_row(outcome.call_id, proposal.tool_name, verdict, detail)
    return table



def _counts(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counter.items(), key=lambda kv: -kv[1]))


def render(
    figures: Figures, *, calls_total: int, requests: int, seconds: float, place: Place,
    unplanned_exits: int = 0,
) -> Table:
    table = Table(
        title=f"toolfence demo: {_n(calls_total, 'call')} in {_n(requests, 'request')}, {seconds:.0f} s",
        caption=place.describe(),
        show_header=False,
        expand=False,
    )
    table.add_column("", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("", overflow="fold")

    table.add_row(Text("Operations by final state", style="bold"), "", "")
    for state in (State.SUCCEEDED, State.FAILED_TERMINAL, State.RECONCILIATION_PENDING):
        count = figures.states.get(state.value, 0)
        note = ""
        if state is State.FAILED_TERMINAL:
            note = _counts(figures.failed_codes)
        if state is State.RECONCILIATION_PENDING:
            note = (
                f"{_counts(figures.pending_tools)}: an unsafe write whose worker died; "
                "nothing retries it, a person decides (toolfence pending / resolve)"
                if count else "none"
            )
        table.add_row(f"  {state.value}", str(count), note)
    others = {k: v for k, v in figures.states.items() if State(k) not in SETTLED}
    for state_name, count in sorted(others.items()):
        table.add_row(f"  {state_name}", str(count), Text("not settled", style="red"))

    table.add_section()
    rejected = sum(figures.gates.values())
    table.add_row(
        Text("Rejected before running, by gate", style="bold"), str(rejected), "toolfence_calls.gate"
    )
    for gate in Gate:
        if figures.gates.get(gate):
            table.add_row(f"  {gate}", str(figures.gates[gate]), _counts(figures.gate_codes[gate]))
    if figures.reused:
        table.add_row(
            "  repeated writes reused", str(figures.reused),
            "same intent as an earlier write of the request: its result, not a second run",
        )
    refused = sum(figures.refused_at_execution.values())
    table.add_row(
        Text("Refused at execution (re-check)", style="bold"), str(refused),
        "admitted, then refused by the worker against current state, before any downstream call"
        + (f": {_counts(figures.refused_at_execution)}" if refused else ""),
    )

    table.add_section()
    table.add_row(
        Text("Side effects per write operation", style="bold"), str(figures.writes),
        "operations: by the ledger's records / by toolfence's receipts",
    )
    for effects_count in sorted(set(figures.ledger_effects) | set(figures.receipt_effects)):
        table.add_row(
            f"  with {effects_count} effect{'s' if effects_count != 1 else ''}",
            f"{figures.ledger_effects.get(effects_count, 0)} / "
            f"{figures.receipt_effects.get(effects_count, 0)}",
            "" if effects_count <= 1 else Text("more than one: I1 broken", style="red"),
        )
    if figures.ledger_only:
        table.add_row(
            "  effect the worker never reported", str(figures.ledger_only),
            "its worker died after the ledger applied it; the ledger's record is what counts",
        )

    table.add_section()
    table.add_row(Text("Faults and fencing", style="bold"), "", "")
    table.add_row(
        "  lease takeovers", str(figures.takeovers_by_worker + figures.requeued_by_reconciler),
        f"new generation after an expired lease: {figures.requeued_by_reconciler} requeued by the "
        f"reconciler, {figures.takeovers_by_worker} taken over by a worker",
    )
    if figures.lookups_resolved:
        table.add_row("  resolved by lookup", str(figures.lookups_resolved),
                      "the reconciler asked the ledger whether the invoice exists")
    counters = (
        "; workers' counters toolfence_stale_writes_fenced_total: "
        + ", ".join(f"{stage} {value:g}" for stage, value in sorted(figures.stale_counters.items()))
        if figures.stale_counters else ""
    )
    table.add_row(
        "  fenced stale writes", str(figures.fenced_refusals),
        f"writes the ledger refused for an old fencing token (ledger_fenced){counters}",
    )
    table.add_row("  reconciliation_pending", str(figures.states.get(State.RECONCILIATION_PENDING.value, 0)),
                  "waiting for a person: correct for an unsafe write of unknown outcome")
    if unplanned_exits:
        table.add_row("  unplanned process exits", str(unplanned_exits),
                      "not injected by the demo; each was replaced (see the line printed when it happened)")

    table.add_section()
    table.add_row(Text("Invariants (docs/design.md §Invariants)", style="bold"), "", "")
    for check in figures.checks:
        verdict = Text("PASS", style="bold green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(f"  {check.code} {check.title}", verdict, check.evidence)
    return table


# ---------------------------------------------------------------------- entry point
