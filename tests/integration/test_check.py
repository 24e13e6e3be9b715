"""`toolfence check` on a real database (SQLite and PostgreSQL): clean after a small real
run, and failing, naming the invariant and an operation, for each of I1–I7 planted
the way a bug would leave the rows (tests/integration/checkkit.py); the exporter's
gauge shows each one too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from checkkit import PLANTS, STUCK_AFTER, Run, exporter_gauges, make_run, plant_i1, plant_i5, plant_i6
from sqlalchemy import Engine, insert, update

from executor.cli.main import main
from executor.store.invariant_check import INVARIANTS, check
from executor.store.invariant_watch import WATCHED, InvariantWatch
from executor.store.schema import audit_events, calls, receipts
from executor.telemetry.exporter import DatabaseCollector, ExporterConfig
from ledger import service as ledger_service
from ledger.service import Ledger, effects, fenced_writes


@pytest.fixture
def run(engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.delenv("TOOLFENCE_CONFIG", raising=False)
    return make_run(engine, db_url)


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

    # And the exporter's gauge counts it after its first pass, from the same code over its window
    collector = DatabaseCollector(
        db_url, ExporterConfig(stuck_after_seconds=STUCK_AFTER, invariant_window_seconds=3600.0)
    )
    try:
        collector.passes.run_once()
        gauges = exporter_gauges(collector)
    finally:
        collector.close()
    assert gauges[code] == 1, gauges
    assert {c for c, n in gauges.items() if n} == {code} | also


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
    # When checked a chunk of one operation (and one call) at a time, and all at once, and
    # judged by an exporter's pass a chunk at a time over a window reaching before the run
    with engine.connect() as conn, conn.begin():
        small = check(conn, since=None, stuck_after_seconds=STUCK_AFTER, chunk=1)
        large = check(conn, since=None, stuck_after_seconds=STUCK_AFTER)
        watched = InvariantWatch(10 * 365 * 86_400.0, chunk=1).run(conn, now=small.now).violations
    # Then the counts do not depend on the chunking, and the exporter's agree
    assert small.counts() == large.counts()
    assert watched == {code: small.counts()[code] for code in WATCHED}
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
