"""Read a campaign's history and judge it: counts, and each invariant I1–I7 of DESIGN.md.

Definitions (per run):

- **admitted**: a call the producer's `enqueue` answered with an operation id and
  a pending status (from the history's `admission` events and the calls table).
- **lost**: an admitted operation with no row, no call row, not settled once the
  fleet went quiet, or `succeeded` as a write without any accepted effect in the
  ledger (the caller was told it happened and it did not).
- **duplicated**: an operation with more than one accepted effect in the ledger
  (`ledger_effects`, distinct receipts or rows) — I1.
- **unexpected**: an operation nobody admitted, an effect for an operation that
  is not an admitted write (or for a rejected call), an effect on an operation
  that ended `failed_terminal`, or a succeeded write whose recorded receipt is
  not the ledger's.
- **recovered**: settled operations that needed recovery on the way (a second
  generation, a retry, or an action of the reconciler).
- **fenced**: stale writes the fenced downstream refused (`ledger_fenced`).
- **accepted stale writes** (I3): an effect the fenced downstream accepted with a
  token lower than one it had already seen for the key, or a completion recorded
  for a generation older than one already handed out.

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

from executor.core.states import SETTLED, TERMINAL, State, is_legal
from outbox.producer import default_operation_id
from tests.chaos.history import by_kind
from tests.chaos.nemesis import AMBIGUOUS_KINDS, KILL_KINDS, PAUSE_KINDS

SETTLED_STATES = {s.value for s in SETTLED}
TERMINAL_STATES = {s.value for s in TERMINAL}
EFFECT_TOOL = {
    "credit": "ledger.credit",
    "transfer": "ledger.transfer",
    "invoice": "ledger.create_invoice",
    "notice": "ledger.send_notice",
}
MAX_EXAMPLES = 10


def _examples(items: Any) -> list[Any]:
    return sorted(items)[:MAX_EXAMPLES] if not isinstance(items, list) else items[:MAX_EXAMPLES]


def check(history_path: Path) -> dict[str, Any]:
    h = by_kind(history_path)
    admissions = h.get("admission", [])
    operations = {r["operation_id"]: r for r in h.get("db.operations", [])}
    calls = h.get("db.calls", [])
    audit = sorted(h.get("db.audit", []), key=lambda e: e["event_id"])
    receipts = h.get("db.receipts", [])
    effects = h.get("db.effects", [])
    fenced = h.get("db.fenced", [])
    finals = h.get("db.final_results", [])
    quiet = (h.get("quiet") or [{}])[-1]

    violations: dict[str, list[Any]] = defaultdict(list)

    # ------------------------------------------------------------- admissions
    admitted_ops: dict[str, dict[str, Any]] = {}
    rejected_calls: list[dict[str, Any]] = []
    for a in admissions:
        if a.get("operation_id") and a.get("status") == "pending":
            admitted_ops[a["operation_id"]] = a
        elif a.get("status") == "failed_terminal" and not a.get("operation_id"):
            rejected_calls.append(a)
    call_ops = {c["operation_id"]: c for c in calls if c.get("operation_id")}
    # An admission the client could only read back (ambiguous commit) is in the
    # calls table too; the calls table is the producer's own truth.
    for op_id, c in call_ops.items():
        admitted_ops.setdefault(op_id, {"request_id": c["request_id"], "call_id": c["call_id"],
                                        "tool": c["tool_name"], "operation_id": op_id})
    write_ops = {op for op, r in operations.items() if r["mode"] == "write"}

    # ------------------------------------------------------------- lost
    lost: dict[str, str] = {}
    for op_id in admitted_ops:
        row = operations.get(op_id)
        if row is None:
            lost[op_id] = "no operation row"
        elif op_id not in call_ops:
            lost[op_id] = "no call row"
        elif row["state"] not in SETTLED_STATES:
            lost[op_id] = f"not settled: {row['state']}"

    effects_by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in effects:
        effects_by_op[e["operation_id"]].append(e)
    for op_id in write_ops:
        row = operations[op_id]
        if row["state"] == State.SUCCEEDED.value and not effects_by_op.get(op_id):
            lost.setdefault(op_id, "succeeded write without an accepted effect")

    # ------------------------------------------------------------- duplicated (I1)
    duplicated = {
        op_id: len(rows) for op_id, rows in effects_by_op.items()
        if len(rows) > 1 or len({r["receipt"] for r in rows}) > 1
    }
    toolfence_receipts: dict[str, set[str]] = defaultdict(set)
    for r in receipts:
        if r["accepted"]:
            toolfence_receipts[r["operation_id"]].add(r["receipt"])
    for op_id, seen in toolfence_receipts.items():
        if len(seen) > 1:
            duplicated.setdefault(op_id, len(seen))

    # ------------------------------------------------------------- unexpected
    unexpected: dict[str, str] = {}
    for op_id in operations:
        if op_id not in admitted_ops:
            unexpected[op_id] = "operation nobody admitted"
    rejected_op_ids = {default_operation_id(r["request_id"], r["call_id"]) for r in rejected_calls}
    for op_id, rows in effects_by_op.items():
        row = operations.get(op_id)
        if op_id in rejected_op_ids:
            unexpected[op_id] = "effect for a rejected call"
        elif row is None or op_id not in admitted_ops:
            unexpected[op_id] = "effect for an operation nobody admitted"
        elif row["mode"] != "write" or EFFECT_TOOL.get(rows[0]["effect_kind"]) != row["tool_name"]:
            unexpected[op_id] = "effect of the wrong kind"
        elif row["state"] == State.FAILED_TERMINAL.value:
            unexpected[op_id] = f"effect on an operation that failed ({row['error_code']})"
        elif row["state"] == State.SUCCEEDED.value and row["receipt"] not in {r["receipt"] for r in rows}:
            unexpected[op_id] = "recorded receipt is not the ledger's"

    # ------------------------------------------------------------- I5: transitions
    events_by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in audit:
        events_by_op[e["operation_id"]].append(e)
    for op_id, row in operations.items():
        trail = events_by_op.get(op_id, [])
        previous: str | None = None
        highest = 0
        for e in trail:
            if e["from_state"] != previous:
                violations["I5"].append(f"{op_id}: event {e['event_id']} from {e['from_state']} "
                                        f"but the operation was {previous}")
            if not is_legal(e["from_state"], e["to_state"]):
                violations["I5"].append(f"{op_id}: illegal {e['from_state']} -> {e['to_state']}")
            if e["generation"] < highest:
                violations["I5"].append(f"{op_id}: generation went back {highest} -> {e['generation']}")
            highest = max(highest, e["generation"])
            previous = e["to_state"]
        if previous != row["state"]:
            violations["I5"].append(f"{op_id}: audit ends in {previous}, row says {row['state']}")
        if row["generation"] != highest:
            violations["I5"].append(f"{op_id}: row generation {row['generation']} != audit {highest}")

    # ------------------------------------------------------------- I3: stale writes
    stale_accepted: list[str] = []
    # (a) completions: a terminal event must carry the newest generation handed out.
    for op_id, trail in events_by_op.items():
        highest = 0
        for e in trail:
            if e["to_state"] == State.STARTED.value:
                highest = max(highest, e["generation"])
            elif e["from_state"] == State.STARTED.value and e["generation"] < highest:
                stale_accepted.append(f"{op_id}: {e['to_state']} recorded for generation "
                                      f"{e['generation']} after {highest} was reserved")
    # (b) the fenced downstream: tokens it had seen for the key (effects, refusals, and
    # receipts toolfence recorded after the ledger answered) before each accepted effect.
    seen_tokens: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in effects:
        if e["effect_kind"] == "transfer":
            seen_tokens[e["idempotency_key"]].append((e["at"], e["generation"]))
    for f in fenced:
        seen_tokens[f["idempotency_key"]].append((f["at"], f["token"]))
    transfer_ops = {op for op, r in operations.items() if r["tool_name"] == "ledger.transfer"}
    for r in receipts:
        if r["operation_id"] in transfer_ops and r["accepted"]:
            seen_tokens[f"toolfence:{r['operation_id']}"].append((r["recorded_at"], r["generation"]))
    for e in effects:
        if e["effect_kind"] != "transfer":
            continue
        earlier = [token for at, token in seen_tokens[e["idempotency_key"]] if at < e["at"]]
        if earlier and max(earlier) > e["generation"]:
            stale_accepted.append(f"{e['operation_id']}: transfer accepted token {e['generation']} "
                                  f"after {max(earlier)}")
    # Non-fencing downstreams accepting an older generation's write (harmless when
    # deduplicated; reported so a duplicate can be traced to its cause).
    reserved_at: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in audit:
        if e["to_state"] == State.STARTED.value:
            reserved_at[e["operation_id"]].append((e["at"], e["generation"]))
    late_unfenced: Counter[str] = Counter()
    for e in effects:
        newer = [g for at, g in reserved_at.get(e["operation_id"], [])
                 if at < e["at"] and g > e["generation"]]
        if newer and e["effect_kind"] != "transfer":
            late_unfenced[e["effect_kind"]] += 1

    # ------------------------------------------------------------- I6: results
    proposed = {(a["request_id"], a["call_id"]): a.get("proposed_tool", a["tool"]) for a in admissions}
    final_by_call: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for f in finals:
        final_by_call[(f["request_id"], f["call_id"])].append(f)
    for key, tool in proposed.items():
        got = final_by_call.get(key, [])
        if len(got) != 1:
            violations["I6"].append(f"{key}: {len(got)} results")
            continue
        if got[0]["tool_name"] != tool:
            violations["I6"].append(f"{key}: result names {got[0]['tool_name']}, call was {tool}")
        if got[0]["status"] == "pending" and got[0].get("state") not in SETTLED_STATES:
            violations["I6"].append(f"{key}: no terminal result ({got[0].get('state')})")
    for key in final_by_call:
        if key not in proposed:
            violations["I6"].append(f"{key}: a result for a call nobody proposed")

    # ------------------------------------------------------------- I7: rejected calls
    for r in rejected_calls:
        op_id = default_operation_id(r["request_id"], r["call_id"])
        if op_id in operations or op_id in events_by_op or op_id in effects_by_op:
            violations["I7"].append(f"rejected call {r['request_id']}/{r['call_id']} reached {op_id}")

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

    if lost:
        violations["I4"].extend(f"lost {op}: {why}" for op, why in sorted(lost.items()))
    for op, why in sorted(unexpected.items()):
        if "nobody admitted" in why or "rejected" in why:
            violations["I4"].append(f"unexpected {op}: {why}")
    if duplicated:
        violations["I1"].extend(f"{op}: {n} effects" for op, n in sorted(duplicated.items()))
    violations["I3"].extend(stale_accepted)

    invariants = {
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
        "late_unfenced_effects": dict(late_unfenced),
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
        all(v["ok"] for v in invariants.values())
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
        "invariants": invariants,
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
