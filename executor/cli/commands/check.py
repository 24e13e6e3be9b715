"""`toolfence check`: invariants I1–I7 on the live database, for a person or for cron."""

from __future__ import annotations

import argparse
import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from executor.cli.args import EXIT_FAILURE, EXIT_USAGE, UserError

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from executor.store.invariant_check import CheckReport

HELP = "Check invariants I1–I7 on the database (exit 1 when one is violated)."
DESCRIPTION = """\
Checks the invariants of docs/design.md §Invariants on the live database with the
functions the demo and the chaos checker use, over the operations touched within
a window (an audit event, accepted receipt, call or downstream effect written in
it; each judged on all its records) or the whole tables (--all). Read-only, in one
snapshot, taking no lock a worker waits for: safe from cron beside the reconciler.

What each is computed from on a live database, and what it cannot see:
  I1  accepted receipts per operation, and the reference ledger's effect rows when
      its tables are in the database; an effect nobody reported is invisible.
  I2  operations overdue now by TOOLFENCE_EXPORTER_STUCK_AFTER_SECONDS (a live
      system is never quiet), whatever the window.
  I3  exits from `started` recorded for an older generation than one reserved
      (audit trail), and the ledger's fenced effects after a higher token; lease
      renewals leave no record.
  I4  the calls table as the proposals: an admitted call with no operation row or
      another call's, an operation no call admitted, a succeeded write with no
      receipt or effect; what never reached the database cannot be seen.
  I5  each operation's whole audit trail.
  I6  each call's answer (its stored result or its operation) and its tool name.
  I7  the operation id a rejected call would have had by default: no operation,
      audit event, receipt or effect under it.

Exit status: 0 all hold, 1 a violation (the table names the invariant and
operations), 2 the check could not run (usage, configuration, database)."""

MAX_WINDOW_SECONDS = 3650 * 86_400.0
_DURATION = re.compile(r"(?P<amount>\d+(?:\.\d+)?)(?P<unit>[smhdw])")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
MAX_EXAMPLES = 1000


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "check", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.set_defaults(func=run)
    window = parser.add_mutually_exclusive_group()
    window.add_argument(
        "--since", default="24h", metavar="DURATION|TIMESTAMP",
        help="the window: a duration back from now (30m, 24h, 7d) or an ISO 8601 time (default: 24h)",
    )
    window.add_argument("--all", action="store_true", help="the whole tables instead of a window")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--limit", type=int, default=5, metavar="N", help="operations shown per invariant (default: 5)"
    )
    parser.add_argument(
        "--no-downstream", action="store_true",
        help="read toolfence's tables only, even when the ledger's are present",
    )


def window_start(value: str, now: float) -> float:
    """`--since` as epoch seconds: a duration back from `now`, or an ISO 8601 time
    (UTC unless it says otherwise)."""
    text = value.strip()
    match = _DURATION.fullmatch(text)
    if match is not None:
        span = float(match["amount"]) * _UNIT_SECONDS[match["unit"]]
        if not math.isfinite(span) or span > MAX_WINDOW_SECONDS:
            raise UserError(f"--since {value!r} is longer than ten years (use --all)", EXIT_USAGE)
        return now - span
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(
            f"--since must be a duration (30m, 24h, 7d) or an ISO 8601 time, not {value[:64]!r}", EXIT_USAGE
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from executor.cli.common import engine_of, first_line, print_json, settings
    from executor.store.engine import read_only

    if not 1 <= args.limit <= MAX_EXAMPLES:
        raise UserError(f"--limit must be from 1 to {MAX_EXAMPLES}, not {args.limit}", EXIT_USAGE)
    chosen = settings()
    stuck_after = float(args.loaded["TOOLFENCE_EXPORTER_STUCK_AFTER_SECONDS"].value)
    try:
        engine = engine_of(chosen)
        with read_only(engine).connect() as conn:
            report = _check(conn, args, stuck_after)
    except SQLAlchemyError as exc:
        # Exit 1 is a violation: a check that could not run must not look like one.
        reason = first_line(getattr(exc, "orig", None) or exc)
        raise UserError(f"could not check the database: {reason}", EXIT_USAGE) from None
    if args.json:
        print_json(_shown_report(report))
    else:
        print(render(report))
    return 0 if report.ok else EXIT_FAILURE


def _check(conn: Connection, args: argparse.Namespace, stuck_after: float) -> CheckReport:
    from sqlalchemy import select

    from executor.store.clock import db_now
    from executor.store.invariant_check import check

    if conn.dialect.name == "postgresql":
        # One snapshot for every chunk, and a transaction that cannot write.
        conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
    with conn.begin():
        now = float(conn.execute(select(db_now())).scalar_one())
        since = None if args.all else window_start(args.since, now)
        downstream = None
        if not args.no_downstream:
            from ledger.invariant_records import ledger_records_if_present

            downstream = ledger_records_if_present(conn)
        return check(
            conn, since=since, stuck_after_seconds=stuck_after, limit=args.limit,
            downstream=downstream, now=now,
        )


def _shown_report(report: CheckReport) -> dict[str, object]:
    """The report with every id through the operator sanitiser (ids are application text)."""
    from executor.cli.common import iso, shown

    data = report.as_dict()
    data["now"], data["since"] = iso(data["now"]), iso(data["since"])
    for entry in data["invariants"].values():
        for example in entry["examples"]:
            example["subject"] = shown(example["subject"])
            if example["operation_id"] is not None:
                example["operation_id"] = shown(example["operation_id"])
    return data


def render(report: CheckReport) -> str:
    """The report as a plain table (cron mails it as it is)."""
    from executor.cli.common import iso, shown

    window = "all history" if report.since is None else f"since {iso(report.since)}"
    sources = "toolfence's tables" + (f" and the {report.downstream}'s" if report.downstream else "")
    lines = [
        f"toolfence check: {window}; {report.operations} operations and {report.calls} calls "
        f"from {sources}",
        "",
        f"{'invariant':<10} {'result':<6} {'violations':>10}  examples",
    ]
    for code, tally in report.tallies.items():
        verdict = "ok" if not tally.violations else "FAIL"
        examples = "; ".join(
            f"{shown(e.operation_id or e.subject)}: {e.reason}" for e in tally.examples
        ) or "-"
        lines.append(f"{code:<10} {verdict:<6} {tally.violations:>10}  {examples}")
        lines.append(f"{'':<10} {tally.title}")
    lines.append("")
    lines.append("all invariants hold" if report.ok else
                 "VIOLATED: " + ", ".join(c for c, t in report.tallies.items() if t.violations))
    return "\n".join(lines)
