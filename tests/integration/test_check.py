"""`toolfence check` on a real database (SQLite and PostgreSQL): clean after a small real
run, and failing, naming the invariant and an operation, for each of I1–I7 planted
the way a bug would leave the rows; the exporter's gauge shows each one too.

The run is real: calls admitted by `enqueue`, run by the worker's `OperationRunner`
in process. The planted rows are what a broken store, worker or producer would
have written, through plain INSERTs and UPDATEs, after the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from notekit import NoteArgs, Out, read_note
from paykit import Paid, PayArgs
from sqlalchemy import Connection, Engine, insert, select, update

from executor.cli.main import main
from executor.core.identifiers import default_operation_id
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.clock import db_now
from executor.store.invariant_check import INVARIANTS, check
from executor.store.schema import audit_events, calls, operations, receipts
from executor.telemetry.exporter import ExporterConfig, invariant_violations, make_scrape_engine, scrape
from executor.worker.runner import OperationRunner
from ledger import service as ledger_service
from ledger.service import Ledger, effects, fenced_writes
from outbox.producer import enqueue

TENANT = "acme"
ALICE = ServerContext(principal="alice", tenant=TENANT, roles=frozenset({"member"}), request_id="r")
STUCK_AFTER = 600.0


def _pay(args: PayArgs, ctx: RunContext) -> Written:
    receipt = f"pay-{ctx.operation_id[-8:]}"
    return Written(Paid(receipt=receipt), receipt)


REGISTRY = Registry([
    Tool(
        name="bank.pay", description="pay from an account", mode=Mode.WRITE, untrusted_output=False,
        input_model=PayArgs, output_model=Paid, run=_pay, access=Access.public_tool(),
        approval=Approval.never(), effect=[Effect.IDEMPOTENT],
    ),
    Tool(
        name="notes.read", description="read a note", mode=Mode.READ, input_model=NoteArgs,
        output_model=Out, run=read_note, access=Access.public_tool(), untrusted_output=False,
        approval=Approval.never(),
    ),
])


@dataclass(frozen=True)
class Run:
    """What the small real run left: a succeeded write, a succeeded read, a rejected call."""

    write: str
    read: str
    rejected_call: str
    rejected_operation: str
    now: float


@pytest.fixture
def run(engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.delenv("TOOLFENCE_CONFIG", raising=False)
    proposals = [
        ProposedCall(call_id="c-pay", tool_name="bank.pay", arguments={"account": "a-1", "amount": 5}),
        ProposedCall(call_id="c-read", tool_name="notes.read", arguments={"text": "hello"}),
        ProposedCall(call_id="c-pay-2", tool_name="bank.pay", arguments={"account": "a-2", "amount": 7}),
        # Refused by the schema gate: never runs.
        ProposedCall(call_id="c-bad", tool_name="bank.pay", arguments={"account": "a-1", "amount": -1}),
    ]
    context = ALICE.model_copy(update={"request_id": "req-1"})
    with engine.begin() as conn:
        handle = enqueue(conn, proposals, context, REGISTRY)
    admitted = {c.call_id: c.operation_id for c in handle.calls}
    assert admitted["c-bad"] is None
    runner = OperationRunner(Settings(database_url=db_url, broker_url="memory://"), REGISTRY, engine)
    for call_id in ("c-pay", "c-read", "c-pay-2"):
        operation_id = admitted[call_id]
        assert operation_id is not None
        runner.handle(operation_id)
    with engine.connect() as conn:
        now = float(conn.execute(select(db_now())).scalar_one())
        states = dict(conn.execute(select(operations.c.call_id, operations.c.state)).all())
    assert states == {"c-pay": "succeeded", "c-read": "succeeded", "c-pay-2": "succeeded"}
    return Run(
        write=str(admitted["c-pay"]), read=str(admitted["c-read"]), rejected_call="c-bad",
        rejected_operation=default_operation_id(TENANT, "req-1", "c-bad"), now=now,
    )


def toolfence_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["check", *args])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def check_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    status, out = toolfence_check(capsys, "--json", *args)
    return status, json.loads(out)


def failing(report: dict[str, Any]) -> dict[str, list[str | None]]:
    return {
        code: [e["operation_id"] for e in entry["examples"]]
        for code, entry in report["invariants"].items() if entry["violations"]
    }


# ------------------------------------------------------------------ clean


def test_check__after_a_real_run__every_invariant_holds_exit_0(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the database of a small real run (admitted, rejected, run to the end)
    # When an operator checks the default window, and then all history
    status, text = toolfence_check(capsys)
    all_status, report = check_json(capsys, "--all")

    # Then every invariant holds, over the run's operations and calls
    assert status == 0, text
    assert "all invariants hold" in text
    for code in INVARIANTS:
        assert f"\n{code} " in text and "FAIL" not in text
    assert all_status == 0 and report["ok"], report
    assert (report["operations_checked"], report["calls_checked"]) == (3, 4)
    assert report["since"] is None and report["downstream"] is None


# ------------------------------------------------------------------ one violation each


def _event(operation_id: str, from_state: str | None, to_state: str, generation: int, at: float,
           decision: str = "planted") -> dict[str, Any]:
    return {
        "operation_id": operation_id, "from_state": from_state, "to_state": to_state,
        "decision_code": decision, "generation": generation, "at": at,
    }


def plant_i1(conn: Connection, run: Run) -> str:
    # A second, different receipt accepted for the write: a second effect downstream.
    conn.execute(insert(receipts).values(
        operation_id=run.write, generation=1, receipt="pay-second", accepted=True, source="worker",
        recorded_at=run.now,
    ))
    return run.write


def plant_i2(conn: Connection, run: Run) -> str:
    # A call admitted an hour ago whose message was lost, and no reconciler ran since.
    with_context = ALICE.model_copy(update={"request_id": "req-lost"})
    handle = enqueue(conn, [ProposedCall(call_id="c-lost", tool_name="notes.read",
                                         arguments={"text": "lost"})], with_context, REGISTRY)
    operation_id = str(handle.calls[0].operation_id)
    conn.execute(update(operations).where(operations.c.operation_id == operation_id).values(
        available_at=run.now - 3600, queued_at=run.now - 3600,
    ))
    return operation_id


def plant_i3(conn: Connection, run: Run) -> str:
    # The write's lease was taken over (generation 2), then the stale generation 1
    # completed it: the CAS on the generation did not hold.
    conn.execute(update(audit_events).where(
        audit_events.c.operation_id == run.write, audit_events.c.to_state == "succeeded"
    ).values(from_state="started", to_state="started", generation=2, decision_code="lease_takeover"))
    conn.execute(insert(audit_events).values(_event(run.write, "started", "succeeded", 1, run.now)))
    conn.execute(update(operations).where(operations.c.operation_id == run.write).values(generation=2))
    return run.write


def plant_i4(conn: Connection, run: Run) -> str:
    # An operation (with its audit event) that no call row admitted.
    invented = "op-invented"
    row = conn.execute(select(operations).where(operations.c.operation_id == run.read)).one()._asdict()
    row.update(operation_id=invented, call_id="c-nobody", state="queued", generation=0,
               created_at=run.now, available_at=run.now, finished_at=None, result=None)
    conn.execute(insert(operations).values(row))
    conn.execute(insert(audit_events).values(_event(invented, None, "queued", 0, run.now)))
    return invented


def plant_i5(conn: Connection, run: Run) -> str:
    # A terminal operation moved on: succeeded → failed_terminal is no transition.
    conn.execute(insert(audit_events).values(
        _event(run.read, "succeeded", "failed_terminal", 1, run.now)
    ))
    return run.read


def plant_i6(conn: Connection, run: Run) -> str:
    # A read's call row answered by the write's operation (a repeat pointed at the wrong one).
    conn.execute(insert(calls).values(
        tenant=TENANT, request_id="req-1", call_id="c-read-again", position=5, tool_name="notes.read",
        operation_id=run.write, reused_from_call_id="c-read", created_at=run.now,
    ))
    return run.write


def plant_i7(conn: Connection, run: Run) -> str:
    # The rejected call's handler ran anyway and its receipt was recorded.
    conn.execute(insert(receipts).values(
        operation_id=run.rejected_operation, generation=1, receipt="pay-rejected", accepted=True,
        source="worker", recorded_at=run.now,
    ))
    return run.rejected_operation


PLANTS: dict[str, Callable[[Connection, Run], str]] = {
    "I1": plant_i1, "I2": plant_i2, "I3": plant_i3, "I4": plant_i4,
    "I5": plant_i5, "I6": plant_i6, "I7": plant_i7,
}


@pytest.mark.parametrize("code", INVARIANTS)
def test_check__planted_violation__exit_1_naming_the_invariant_and_the_operation(
    code: str, run: Run, engine: Engine, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the clean run's database with one invariant's violation planted
    with engine.begin() as conn:
        operation_id = PLANTS[code](conn, run)

    # When an operator checks the default window, as a table and as JSON
    status, text = toolfence_check(capsys)
    json_status, report = check_json(capsys)

    # Then it exits 1, naming the invariant and the operation
    assert (status, json_status) == (1, 1), text
    assert "VIOLATED: " in text and code in text.splitlines()[-1], text
    row = next(line for line in text.splitlines() if line.startswith(f"{code} "))
    assert "FAIL" in row and operation_id in row, text
    found = failing(report)
    assert operation_id in found[code], report
    # Stale completions also send the generation backwards (I5), and a rejected call
    # that ran left a receipt of an operation nobody admitted (I4); nothing else.
    also = {"I3": {"I5"}, "I7": {"I4"}}.get(code, set())
    assert set(found) == {code} | also, report

    # And the exporter's gauge counts it, from the same code over its window
    config = ExporterConfig(stuck_after_seconds=STUCK_AFTER, invariant_window_seconds=3600.0)
    scraper = make_scrape_engine(db_url, config)
    try:
        snapshot = scrape(scraper, config)
    finally:
        scraper.dispose()
    assert snapshot.invariant_violations[code] == 1, snapshot.invariant_violations
    assert {c for c, n in snapshot.invariant_violations.items() if n} == {code} | also


def test_check__violation_older_than_the_window__only_all_history_sees_it(
    run: Run, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a second accepted receipt recorded three days ago, on an operation
    # touched by nothing since (its audit trail, receipt and call row moved back too)
    with engine.begin() as conn:
        old = run.now - 3 * 86_400
        conn.execute(insert(receipts).values(
            operation_id=run.write, generation=1, receipt="pay-second", accepted=True, source="worker",
            recorded_at=old,
        ))
        for table, column in ((receipts, receipts.c.recorded_at), (audit_events, audit_events.c.at)):
            conn.execute(update(table).where(table.c.operation_id == run.write).values({column: old}))
        conn.execute(update(calls).where(calls.c.operation_id == run.write).values(created_at=old))

    # When checked over the last day, over a week and over all history
    day, _ = check_json(capsys, "--since", "1d")
    week, week_report = check_json(capsys, "--since", "7d")
    everything, _ = check_json(capsys, "--all")

    # Then only the windows that reach back to it fail
    assert (day, week, everything) == (0, 1, 1)
    assert failing(week_report) == {"I1": [run.write]}


def test_check__late_event_of_an_old_operation__inside_the_window(
    run: Run, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an operation created and finished three days ago ...
    old = run.now - 3 * 86_400
    with engine.begin() as conn:
        for table, column in ((receipts, receipts.c.recorded_at), (audit_events, audit_events.c.at)):
            conn.execute(update(table).values({column: old}))
        conn.execute(update(calls).values(created_at=old))
        # ... and an illegal transition of it recorded just now
        plant_i5(conn, run)

    # When checked over the last hour
    status, report = check_json(capsys, "--since", "1h")

    # Then the late event brings the old operation into the window, judged on its whole trail
    assert status == 1
    assert failing(report) == {"I5": [run.read]}
    assert report["operations_checked"] == 1


def test_check__ledger_tables_present__fenced_effect_after_a_higher_token_is_i3(
    run: Run, engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given the reference ledger's tables in the same database, where the fenced
    # downstream refused token 2 and then accepted token 1 for the same operation
    book = Ledger(db_url)
    monkeypatch.setattr(ledger_service, "_default", book)
    book.create_schema()
    book.engine.dispose()
    receipt = f"pay-{run.write[-8:]}"
    with engine.begin() as conn:
        conn.execute(insert(fenced_writes).values(
            operation_id=run.write, idempotency_key=f"toolfence:{run.write}", token=2, highest_token=2,
            at=run.now - 2,
        ))
        conn.execute(insert(effects).values(
            receipt=receipt, operation_id=run.write, idempotency_key=f"toolfence:{run.write}",
            generation=1, kind="transfer", at=run.now - 1,
        ))

    # When checked with the ledger's records, and without them
    status, report = check_json(capsys)
    blind, blind_report = check_json(capsys, "--no-downstream")

    # Then only the ledger's own records show the stale write it accepted
    assert status == 1 and report["downstream"] == "ledger"
    assert failing(report) == {"I3": [run.write]}
    assert blind == 0 and blind_report["downstream"] is None


# ------------------------------------------------------------------ bounds and errors


def test_check__chunks_smaller_than_the_run__same_report(run: Run, engine: Engine) -> None:
    # Given violations on several operations
    with engine.begin() as conn:
        plant_i1(conn, run)
        plant_i5(conn, run)
        plant_i6(conn, run)
    # When checked a chunk of one operation (and one call) at a time, and all at once
    with engine.connect() as conn, conn.begin():
        small = check(conn, since=None, stuck_after_seconds=STUCK_AFTER, chunk=1)
        large = check(conn, since=None, stuck_after_seconds=STUCK_AFTER)
        gauges = invariant_violations(conn, small.now, stuck_after_seconds=STUCK_AFTER, window_seconds=None)
    # Then the counts do not depend on the chunking, and the exporter's agree
    assert small.counts() == large.counts() == gauges
    assert {c for c, n in small.counts().items() if n} == {"I1", "I5", "I6"}


@pytest.mark.parametrize(
    "args",
    [("--since", "yesterday"), ("--since", "99999w"), ("--limit", "0")],
    ids=["not-a-duration", "over-ten-years", "limit-zero"],
)
def test_check__bad_arguments__exit_2(
    args: tuple[str, ...], run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    status, text = toolfence_check(capsys, *args)
    assert status == 2, text
    assert text.startswith("toolfence: ") and len(text.splitlines()) == 1, text


def test_check__all_and_since_together__usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["check", "--all", "--since", "1h"])
    assert stopped.value.code == 2


def test_check__database_unreachable__exit_2_not_a_violation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:1/nowhere")
    status, text = toolfence_check(capsys)
    assert status == 2, text
    assert "could not check the database" in text
