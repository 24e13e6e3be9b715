"""The evidence: figures and invariants I1–I7 from the database and the ledger, as tables."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine, select

from executor.cli.demo.place import Place
from executor.cli.demo.workload import DemoRequest
from executor.core.states import SETTLED, State, is_legal
from executor.core.types import (
    FailedRetryable,
    FailedTerminal,
    Succeeded,
)
from executor.store.engine import read_only
from executor.store.schema import audit_events, calls, operations, receipts


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
    from outbox.producer import default_operation_id, final, results, settled

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
        if row.result is not None:
            gate = row.gate or "?"
            figures.gates[gate] += 1
            figures.gate_codes[gate][json.loads(row.result).get("error", {}).get("code", "?")] += 1
    ledger_receipts: dict[str, set[str]] = defaultdict(set)
    for effect in effect_rows:
        ledger_receipts[effect.operation_id].add(effect.receipt)
    accepted: dict[str, set[str]] = defaultdict(set)
    for receipt in receipt_rows:
        if receipt.accepted:
            accepted[receipt.operation_id].add(receipt.receipt)
    write_ops = [op for op in ops.values() if op.mode == "write"]
    figures.writes = len(write_ops)
    for op in write_ops:
        figures.ledger_effects[len(ledger_receipts.get(op.operation_id, ()))] += 1
        figures.receipt_effects[len(accepted.get(op.operation_id, ()))] += 1
        if ledger_receipts.get(op.operation_id) and not accepted.get(op.operation_id):
            figures.ledger_only += 1
    figures.fenced_refusals = len(fenced_rows)
    decisions = Counter(e.decision_code for e in events)
    figures.takeovers_by_worker = decisions["lease_takeover"]
    figures.requeued_by_reconciler = decisions["requeued_stale"]
    figures.lookups_resolved = decisions["lookup_done"]
    figures.stale_counters = _stale_counters(metrics_dir)

    # ---- I1: at most one distinct receipt per operation, in either party's records
    over: list[str] = []
    for operation_id in set(ledger_receipts) | set(accepted):
        if len(ledger_receipts.get(operation_id, set()) | accepted.get(operation_id, set())) > 1:
            over.append(operation_id)
    most = max(
        [len(ledger_receipts.get(o, set()) | accepted.get(o, set())) for o in ops] or [0]
    )
    figures.checks.append(Check(
        "I1", "≤ 1 side effect per operation", not over,
        f"max {most} distinct receipt per operation (ledger records ∪ toolfence receipts)"
        if not over else f"{len(over)} operations with more: {_examples(over)}",
    ))

    # ---- I2: quiet → terminal or reconciliation_pending
    unsettled = [o for o, op in ops.items() if State(op.state) not in SETTLED]
    figures.checks.append(Check(
        "I2", "everything settled once quiet", not unsettled,
        f"{len(ops)} of {len(ops)} operations terminal or reconciliation_pending" if not unsettled
        else f"{len(unsettled)} still moving: {_examples(unsettled)}",
    ))

    # ---- I3: no write from a stale generation accepted
    grants: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for event in events:
        if event.decision_code in ("reserved", "lease_takeover"):
            grants[event.operation_id].append((int(event.generation), float(event.at)))
    stale_effects: list[str] = []
    for effect in effect_rows:
        superseded = [
            at for generation, at in grants.get(effect.operation_id, []) if generation > effect.generation
        ]
        if superseded and min(superseded) < effect.at:
            stale_effects.append(effect.operation_id)
    refused = {(row.operation_id, int(row.token)) for row in fenced_rows}
    accepted_after_refusal = [
        e.operation_id for e in effect_rows if (e.operation_id, int(e.generation)) in refused
    ]
    finished = (State.SUCCEEDED.value, State.FAILED_TERMINAL.value)
    completions = [e for e in events if e.from_state == State.STARTED.value and e.to_state in finished]
    stale_completions = [
        e.operation_id for e in completions
        if int(e.generation) != max((g for g, _ in grants.get(e.operation_id, [])), default=0)
    ]
    i3_bad = stale_effects + accepted_after_refusal + stale_completions
    figures.checks.append(Check(
        "I3", "no stale write accepted", not i3_bad,
        f"{len(effect_rows)} ledger effects, each by the generation that owned the operation then; "
        f"{len(completions)} completions by the current generation; "
        f"{len(fenced_rows)} stale token{'s' if len(fenced_rows) != 1 else ''} refused, none accepted"
        if not i3_bad else
        f"stale effects {len(stale_effects)}, accepted after refusal {len(accepted_after_refusal)}, "
        f"stale completions {len(stale_completions)}: {_examples(i3_bad)}",
    ))

    # ---- I4: no admitted proposal lost; no operation that was not admitted
    proposed = {(r.request_id, c.call_id) for r in requests for c in r.calls}
    recorded = {(row.request_id, row.call_id) for row in call_rows}
    admitted = [row for row in call_rows if row.operation_id is not None]
    orphan_calls = [
        row.call_id for row in admitted
        if row.operation_id not in ops
        or (ops[row.operation_id].request_id, ops[row.operation_id].call_id) != (row.request_id, row.call_id)
    ]
    referenced = {row.operation_id for row in admitted}
    unadmitted_ops = [o for o in ops if o not in referenced]
    i4_ok = proposed == recorded and not orphan_calls and not unadmitted_ops
    figures.checks.append(Check(
        "I4", "no proposal lost or invented", i4_ok,
        f"{len(proposed)} proposals recorded; {len(admitted)} admitted = {len(ops)} operations"
        if i4_ok else
        f"missing proposals {len(proposed - recorded)}, unknown {len(recorded - proposed)}, "
        f"admitted without operation {len(orphan_calls)}, operations without admission {len(unadmitted_ops)}",
    ))

    # ---- I5: legal transitions, consistent trail, monotonic generation
    by_op: dict[str, list[Any]] = defaultdict(list)
    for event in events:
        by_op[event.operation_id].append(event)
    illegal: list[str] = []
    for operation_id, trail in by_op.items():
        previous_state: str | None = None
        previous_generation = 0
        for event in trail:
            if (
                not is_legal(event.from_state, event.to_state)
                or event.from_state != previous_state
                or event.generation < previous_generation
            ):
                illegal.append(operation_id)
                break
            previous_state, previous_generation = event.to_state, int(event.generation)
        else:
            current = ops.get(operation_id)
            if (
                current is None
                or current.state != previous_state
                or current.generation != previous_generation
            ):
                illegal.append(operation_id)
    untraced = [o for o in ops if o not in by_op]
    figures.checks.append(Check(
        "I5", "legal transitions, generation grows", not illegal and not untraced,
        f"{len(events)} audit events over {len(by_op)} operations, each trail legal and "
        "ending in the operation's state and generation"
        if not illegal and not untraced
        else f"{len(illegal)} bad trails, {len(untraced)} untraced: {_examples(illegal + untraced)}",
    ))

    # ---- I6: one terminal result per call id, with its own tool name
    wrong: list[str] = []
    for request in requests:
        statuses = results(engine, request.request_id)
        if [s.call_id for s in statuses] != [c.call_id for c in request.calls]:
            wrong.append(request.request_id)
            continue
        for proposal, status in zip(request.calls, statuses, strict=True):
            outcome = final(status)
            if (
                status.tool_name != proposal.tool_name
                or not settled(status)
                or getattr(status, "state", None) == State.PENDING_APPROVAL.value
                or not isinstance(outcome, Succeeded | FailedTerminal | FailedRetryable)
                or outcome.call_id != proposal.call_id
            ):
                wrong.append(f"{request.request_id}/{proposal.call_id}")
    figures.checks.append(Check(
        "I6", "one result per call id", not wrong,
        f"{len(proposed)} calls in {len(requests)} requests: one terminal result each, in proposal "
        "order, with its own tool name"
        if not wrong else f"{len(wrong)} wrong: {_examples(wrong)}",
    ))

    # ---- I7: a rejected call invoked its handler zero times
    rejected_ids = {
        default_operation_id(row.request_id, row.call_id) for row in call_rows if row.operation_id is None
    }
    traced = (
        rejected_ids & set(ops)
        | rejected_ids & set(by_op)
        | rejected_ids & {r.operation_id for r in receipt_rows}
        | rejected_ids & {e.operation_id for e in effect_rows}
    )
    figures.checks.append(Check(
        "I7", "rejected calls never ran", not traced,
        f"{len(rejected_ids)} rejected calls: no operation, audit event, receipt or ledger effect"
        if not traced else f"{len(traced)} rejected calls left traces: {_examples(sorted(traced))}",
    ))
    return figures


def _stale_counters(metrics_dir: Path | None) -> dict[str, float]:
    """toolfence_stale_writes_fenced_total by stage, summed over the workers' metric files."""
    if metrics_dir is None or not metrics_dir.is_dir():
        return {}
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(metrics_dir))  # type: ignore[no-untyped-call]
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
    from outbox.producer import final, results

    table = Table(title=f"What the model gets back for {request.request_id}", title_justify="left")
    for header in ("call id", "tool", "result", "detail"):
        table.add_column(header, overflow="fold")
    for proposal, status in zip(request.calls, results(engine, request.request_id), strict=False):
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
    for gate in ("allowlist", "parse", "schema", "authorization", "business_rules", "approval",
                 "ordering", "registration"):
        if figures.gates.get(gate):
            table.add_row(f"  {gate}", str(figures.gates[gate]), _counts(figures.gate_codes[gate]))

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
    table.add_row(Text("Invariants (DESIGN.md)", style="bold"), "", "")
    for check in figures.checks:
        verdict = Text("PASS", style="bold green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(f"  {check.code} {check.title}", verdict, check.evidence)
    return table


# ---------------------------------------------------------------------- entry point
