"""Read a campaign's history and judge it: counts, and each invariant I1–I7 of docs/design.md §Invariants.

Each invariant is defined once, in `executor.core.invariants`; this module turns
the history into its records and reports. Definitions (per run):

- **admitted**: a call the producer's `enqueue` answered with an operation id and
  a pending status (from the history's `admission` events and the calls table).
- **lost** (I4): a proposal with no call row, or an admitted operation with no
  row, no call row, the row of another call, not settled once the fleet went
  quiet, or `succeeded` as a write without any accepted effect in the ledger (the
  caller was told it happened and it did not).
- **duplicated** (I1): an operation with more than one accepted effect: more than
  one ledger effect row, or more than one distinct receipt among the ledger's
  effects and toolfence's accepted receipts together.
- **unexpected**: an operation nobody admitted, an effect for an operation nobody
  admitted or for a rejected call (these three are I4), an effect of the wrong
  kind, an effect on an operation that ended `failed_terminal`, or a succeeded
  write whose recorded receipt is not the ledger's.
- **recovered**: settled operations that needed recovery on the way (a second
  generation, a retry, or an action of the reconciler).
- **fenced**: stale writes the fenced downstream refused (`ledger_fenced`).
- **accepted stale writes** (I3): an effect the fenced downstream accepted with a
  token lower than one it had already seen for the key, or an exit from `started`
  recorded for a generation older than one already handed out.

I2 is judged on time: every admitted operation must be terminal or
`reconciliation_pending` within 2 × lease + one reconciler period after the last
fault ended (the campaign measures it and writes a `quiet` event).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from executor.core import invariants
from executor.core.states import TERMINAL, State
from outbox.producer import default_operation_id
from tests.chaos.history import by_kind
from tests.chaos.nemesis import AMBIGUOUS_KINDS, KILL_KINDS, PAUSE_KINDS

TERMINAL_STATES = {s.value for s in TERMINAL}
EFFECT_TOOL = {
    "credit": "ledger.credit",
    "transfer": "ledger.transfer",
    "invoice": "ledger.create_invoice",
    "notice": "ledger.send_notice",
}
# The ledger's effects that refuse a stale fencing token (`transfer`, effect `fenced`).
FENCED_KINDS = frozenset({"transfer"})
MAX_EXAMPLES = 10


def _examples(items: Any) -> list[Any]:
    return sorted(items)[:MAX_EXAMPLES] if not isinstance(items, list) else items[:MAX_EXAMPLES]


def _records(h: dict[str, list[dict[str, Any]]]) -> invariants.Records:
    return invariants.Records(
        operations=[
            invariants.OperationRecord(r["operation_id"], r["request_id"], r["call_id"], r["tool_name"],
                                       r["mode"], r["state"], r["generation"])
            for r in h.get("db.operations", [])
        ],
        audit=[
            invariants.AuditRecord(e["event_id"], e["operation_id"], e["from_state"], e["to_state"],
                                   e["generation"], e["at"])
            for e in h.get("db.audit", [])
        ],
        receipts=[
            invariants.ReceiptRecord(r["operation_id"], r["generation"], r["receipt"], bool(r["accepted"]),
                                     r["recorded_at"])
            for r in h.get("db.receipts", [])
        ],
        # A repeated write answered from an earlier call points at that call's operation;
        # it is not the operation's admission (the earlier call is).
        calls=[invariants.CallRecord(c["request_id"], c["call_id"],
                                     None if c.get("reused_from_call_id") else c.get("operation_id"))
               for c in h.get("db.calls", [])],
        effects=[
            invariants.EffectRecord(e["operation_id"], e["receipt"], e["generation"], e["at"],
                                    e["effect_kind"], fenced=e["effect_kind"] in FENCED_KINDS)
            for e in h.get("db.effects", [])
        ],
        refusals=[invariants.RefusalRecord(f["operation_id"], f["token"], f["at"])
                  for f in h.get("db.fenced", [])],
    )


def check(history_path: Path) -> dict[str, Any]:
    h = by_kind(history_path)
    admissions = h.get("admission", [])
    operations = {r["operation_id"]: r for r in h.get("db.operations", [])}
    calls = h.get("db.calls", [])
    audit = sorted(h.get("db.audit", []), key=lambda e: e["event_id"])
    effects = h.get("db.effects", [])
    fenced = h.get("db.fenced", [])
    finals = h.get("db.final_results", [])
    quiet = (h.get("quiet") or [{}])[-1]

    records = _records(h)
    violations: dict[str, list[Any]] = defaultdict(list)

    # ------------------------------------------------------------- admissions
    admitted_ops: dict[str, dict[str, Any]] = {}
    rejected_calls: list[dict[str, Any]] = []
    for a in admissions:
        if a.get("operation_id") and a.get("status") == "pending":
            admitted_ops[a["operation_id"]] = a
        elif a.get("status") == "failed_terminal" and not a.get("operation_id"):
            rejected_calls.append(a)
    # An admission the client could only read back (ambiguous commit) is in the
    # calls table too; the calls table is the producer's own truth.
    for c in calls:
        if c.get("operation_id") and not c.get("reused_from_call_id"):
            admitted_ops.setdefault(c["operation_id"], {
                "request_id": c["request_id"], "call_id": c["call_id"], "tool": c["tool_name"],
                "operation_id": c["operation_id"],
            })
    rejected = [
        invariants.RejectedCall(r["request_id"], r["call_id"],
                                default_operation_id(r.get("tenant", ""), r["request_id"], r["call_id"]))
        for r in rejected_calls
    ]
    proposals = [
        invariants.Proposal(a["request_id"], a["call_id"], a.get("proposed_tool", a["tool"]))
        for a in admissions
    ]

    # ------------------------------------------------------------- lost and invented (I4)
    # The campaign's client gives up on a request whose commit it cannot confirm
    # at shutdown, so it may not have heard back from every request it sent.
    admission = invariants.i4_lost_or_invented(
        proposals=proposals, admitted=admitted_ops, calls=records.calls,
        operations=records.operations, effects=records.effects, rejected=rejected,
        every_request_answered=False,
    )
    lost = {v.subject: v.reason for v in admission.lost}

    # ------------------------------------------------------------- duplicated (I1)
    duplicated = {
        v.subject: v.reason for v in invariants.i1_more_than_one_effect(records.receipts, records.effects)
    }

    # ------------------------------------------------------------- unexpected
    # Beyond I4's invented operations and effects: effects that contradict what
    # toolfence recorded as the operation's outcome.
    effects_by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in effects:
        effects_by_op[e["operation_id"]].append(e)
    unexpected: dict[str, str] = {}
    for op_id, rows in effects_by_op.items():
        row = operations.get(op_id)
        if row is None:
            continue
        if row["mode"] != "write" or EFFECT_TOOL.get(rows[0]["effect_kind"]) != row["tool_name"]:
            unexpected[op_id] = "effect of the wrong kind"
        elif row["state"] == State.FAILED_TERMINAL.value:
            unexpected[op_id] = f"effect on an operation that failed ({row['error_code']})"
        elif row["state"] == State.SUCCEEDED.value and row["receipt"] not in {r["receipt"] for r in rows}:
            unexpected[op_id] = "recorded receipt is not the ledger's"
    unexpected.update((v.subject, v.reason) for v in admission.invented)

    # ------------------------------------------------------------- I3, I5, I6, I7
    stale = invariants.i3_stale_writes(records.audit, records.effects, records.refusals, records.receipts)
    stale_accepted = [str(v) for v in stale.violations]
    violations["I5"].extend(str(v) for v in invariants.i5_illegal_trails(records.operations, records.audit))
    results = [
        invariants.ResultRecord(f["request_id"], f["call_id"], f["tool_name"], f["status"], f.get("state"))
        for f in finals
    ]
    violations["I6"].extend(str(v) for v in invariants.i6_one_result_per_call(proposals, results, quiet=True))
    violations["I7"].extend(str(v) for v in invariants.i7_rejected_calls_ran(
        rejected, operations=operations, audit=records.audit, receipts=records.receipts,
        effects=records.effects,
    ))

    # ------------------------------------------------------------- I2: quiet in time
    bound = quiet.get("bound_seconds")
    took = quiet.get("quiet_seconds")
    if not quiet:
        violations["I2"].append("the campaign recorded no quiet measurement")
    elif took is None or bound is None or took > bound:
        violations["I2"].append(f"quiet after {took}s, bound {bound}s "
                                f"({quiet.get('unsettled_at_bound', '?')} unsettled at the bound)")

    # ------------------------------------------------------------- tallies
    states = Counter(operations[op]["state"] for op in admitted_ops if op in operations)
    by_tool_state: dict[str, Counter[str]] = defaultdict(Counter)
    for op in admitted_ops:
        if op in operations:
            by_tool_state[operations[op]["tool_name"]][operations[op]["state"]] += 1
    recovered = 0
    recovered_pending = 0
    events_by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in audit:
        events_by_op[e["operation_id"]].append(e)
    for op_id, trail in events_by_op.items():
        needed = any(
            e["generation"] > 1 or e["actor"] == "reconciler" or e["to_state"] == State.RETRY_WAIT.value
            for e in trail
        )
        if needed and operations.get(op_id, {}).get("state") in TERMINAL_STATES:
            recovered += 1
        elif needed and operations.get(op_id, {}).get("state") == State.RECONCILIATION_PENDING.value:
            recovered_pending += 1
    pending_reasons = Counter(
        f"{r['tool_name']}: {json.loads(r['error']).get('message') if r.get('error') else '?'}"
        for r in operations.values() if r["state"] == State.RECONCILIATION_PENDING.value
    )
    failed_codes = Counter(
        f"{r['tool_name']}: {r['error_code']}"
        for r in operations.values() if r["state"] == State.FAILED_TERMINAL.value
    )
    reservations = sum(1 for e in audit if e["to_state"] == State.STARTED.value)
    faults = Counter(e["fault"] for e in h.get("fault", [])) + Counter(
        e["fault"] for e in h.get("fault_point", [])
    )
    group = {
        "kills (1)": sum(faults[k] for k in KILL_KINDS),
        "zombie pauses (2)": sum(faults[k] for k in PAUSE_KINDS),
        "ambiguous commits (3)": sum(faults[k] for k in AMBIGUOUS_KINDS),
    }
    latencies = sorted(r["seconds"] for r in h.get("result", []) if "seconds" in r)

    violations["I4"].extend(f"lost {v}" for v in admission.lost)
    violations["I4"].extend(f"unexpected {v}" for v in admission.invented)
    violations["I1"].extend(f"{op}: {why}" for op, why in sorted(duplicated.items()))
    violations["I3"].extend(stale_accepted)

    verdicts = {
        name: {"ok": not violations.get(name), "violations": len(violations.get(name, [])),
               "examples": violations.get(name, [])[:MAX_EXAMPLES]}
        for name in ("I1", "I2", "I3", "I4", "I5", "I6", "I7")
    }
    counts = {
        "requests": len({a["request_id"] for a in admissions}),
        "calls": len(admissions),
        "operations": len(admitted_ops),
        "rejected_at_admission": len(rejected_calls),
        "reservations": reservations,
        "effects_accepted": len(effects),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "unexpected": len(unexpected),
        "recovered": recovered,
        "recovered_then_pending": recovered_pending,
        "fenced": len(fenced),
        "accepted_stale_writes": len(stale_accepted),
        "late_unfenced_effects": dict(stale.late_unfenced),
        "ambiguous_enqueues": len(h.get("enqueue_ambiguous", [])),
        "result_timeouts": len(h.get("result_timeout", [])),
        "unexpected_member_exits": len(h.get("member_exit", [])),
        "harness_errors": len(h.get("harness_error", [])),
    }
    exits: Counter[str] = Counter()
    for e in h.get("member_exit", []):
        reason = e.get("reason") or "?"
        if "Unrecoverable error" in reason:
            reason = "Unrecoverable error: " + reason.split("Unrecoverable error:", 1)[1].strip()
        exits[f"{e['role']} exit {e.get('returncode')}: {reason[:160]}"] += 1
    ok = (
        all(v["ok"] for v in verdicts.values())
        and not lost and not duplicated and not unexpected and not stale_accepted
    )
    return {
        "ok": ok,
        "counts": counts,
        "states": dict(states),
        "by_tool": {tool: dict(c) for tool, c in sorted(by_tool_state.items())},
        "pending_reasons": dict(pending_reasons.most_common()),
        "failed_codes": dict(failed_codes.most_common()),
        "faults": dict(sorted(faults.items())),
        "fault_groups": group,
        "invariants": verdicts,
        "examples": {
            "lost": _examples([f"{k}: {v}" for k, v in sorted(lost.items())]),
            "duplicated": _examples(sorted(duplicated)),
            "unexpected": _examples([f"{k}: {v}" for k, v in sorted(unexpected.items())]),
        },
        "quiet": quiet,
        "member_exits": dict(exits.most_common()),
        "latency_seconds": _percentiles(latencies),
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 3)
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(values[-1], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check a chaos campaign's history.")
    parser.add_argument("history", type=Path)
    args = parser.parse_args(argv)
    report = check(args.history)
    print(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
