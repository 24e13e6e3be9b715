"""The exporter's incremental invariant passes (`executor.store.invariant_watch`) on a real
database (SQLite and PostgreSQL): after every pass of a sequence over violations planted
at different times, the exporter's gauges equal what `toolfence check --since <window>`
reports, and a pass after the first judges only what was touched since the one before.

The run and the plants are tests/integration/checkkit.py's; the run is moved half an hour
back, so the passes' one-minute margin does not reach it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from checkkit import (
    STUCK_AFTER,
    TENANT,
    Run,
    exporter_gauges,
    make_run,
    plant_i1,
    plant_i4,
    plant_i5,
    plant_i7,
)
from sqlalchemy import Engine, insert, select, update

from executor.cli.main import main
from executor.store import invariant_watch
from executor.store.clock import db_now
from executor.store.invariant_check import INVARIANTS, check
from executor.store.invariant_watch import WATCHED
from executor.store.schema import ACTIVE_STATES, audit_events, calls, operations, receipts
from executor.telemetry.exporter import DatabaseCollector, ExporterConfig

WINDOW = 3600.0
CONFIG = ExporterConfig(stuck_after_seconds=STUCK_AFTER, invariant_window_seconds=WINDOW)
BACK = 1800.0


@pytest.fixture
def run(engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    """The small real run, every record of it moved `BACK` seconds into the past."""
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.delenv("TOOLFENCE_CONFIG", raising=False)
    done = make_run(engine, db_url)
    with engine.begin() as conn:
        for table, column in (
            (audit_events, audit_events.c.at), (receipts, receipts.c.recorded_at),
            (calls, calls.c.created_at), (operations, operations.c.updated_at),
            (operations, operations.c.created_at),
        ):
            conn.execute(update(table).values({column: column - BACK}))
    return dataclasses.replace(done, now=done.now - BACK)


@pytest.fixture
def collector(db_url: str, run: Run) -> Iterator[DatabaseCollector]:
    """The exporter's database collector, its passes run by hand (no thread)."""
    database = DatabaseCollector(db_url, CONFIG)
    yield database
    database.close()


def checked(capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    """What `toolfence check --since <the exporter's window>` counts, toolfence's tables only."""
    capsys.readouterr()
    main(["check", "--json", "--since", f"{WINDOW:g}s", "--no-downstream"])
    report = json.loads(capsys.readouterr().out)
    return {code: int(entry["violations"]) for code, entry in report["invariants"].items()}


def now_of(engine: Engine, run: Run) -> Run:
    """The run, as the plants see it, at this moment of the database clock."""
    with engine.connect() as conn:
        return dataclasses.replace(run, now=float(conn.execute(select(db_now())).scalar_one()))


def touched_since(engine: Engine, since: float) -> set[str]:
    """The operations a pass from `since` selects, the naive way: every row into Python
    (audit events from a minute earlier: the reader's margin for concurrent clocks)."""
    with engine.connect() as conn:
        return (
            {e.operation_id for e in conn.execute(select(audit_events)) if e.at >= since - 60.0}
            | {r.operation_id for r in conn.execute(select(receipts))
               if r.accepted and r.recorded_at >= since}
            | {c.operation_id for c in conn.execute(select(calls))
               if c.operation_id is not None and c.created_at >= since}
            | {o.operation_id for o in conn.execute(select(operations))
               if o.state in ACTIVE_STATES and o.updated_at >= since}
        )


def only(**counts: int) -> dict[str, int]:
    return {code: counts.get(code, 0) for code in INVARIANTS}


def test_passes__violations_planted_between_them__gauges_equal_check_since_the_window(
    run: Run, engine: Engine, collector: DatabaseCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the run half an hour ago, its write with a second effect recorded then (I1)
    with engine.begin() as conn:
        plant_i1(conn, run)

    # When the exporter's first pass runs
    first = collector.passes.run_once()

    # Then it judged the whole window, and the gauges are what the check counts
    assert first.first and (first.operations, first.calls) == (3, 4)
    assert exporter_gauges(collector) == checked(capsys) == only(I1=1)

    # When nothing is touched before the next pass
    idle = collector.passes.run_once()

    # Then it judges nothing, and what the first found stays
    assert not idle.first and (idle.operations, idle.calls) == (0, 0)
    assert idle.since == pytest.approx(first.now - 60.0)
    assert exporter_gauges(collector) == checked(capsys) == only(I1=1)

    # When, now, the read makes an illegal transition (I5) and the rejected call's
    # handler runs after all (I7; its receipt names an operation nobody admitted: I4)
    fresh = now_of(engine, run)
    with engine.begin() as conn:
        plant_i5(conn, fresh)
        rejected = plant_i7(conn, fresh)
    late = collector.passes.run_once()

    # Then the pass judges those two operations only, and the rejected call of the
    # first pass again through the operation id it would have had
    assert (late.operations, late.calls) == (2, 0)
    assert exporter_gauges(collector, "toolfence_exporter_invariant_pass_judged") == {
        "operations": 2, "calls": 0,
    }
    assert exporter_gauges(collector) == checked(capsys) == only(I1=1, I4=1, I5=1, I7=1)
    assert collector.passes.watch.violations()["I7"] == {rejected}

    # When an operation nobody admitted appears (I4), and after one pass its call row is written
    fresh = now_of(engine, run)
    with engine.begin() as conn:
        invented = plant_i4(conn, fresh)
    collector.passes.run_once()
    assert exporter_gauges(collector) == checked(capsys) == only(I1=1, I4=2, I5=1, I7=1)
    fresh = now_of(engine, run)
    with engine.begin() as conn:
        request_id = conn.execute(
            select(operations.c.request_id).where(operations.c.operation_id == invented)
        ).scalar_one()
        conn.execute(insert(calls).values(
            tenant=TENANT, request_id=request_id, call_id="c-nobody", position=9,
            tool_name="notes.read", operation_id=invented, created_at=fresh.now,
        ))
    admitted = collector.passes.run_once()

    # Then it is judged again with its call, and holds: the gauge drops as the check's count does
    # (the pass also judges what was touched in the minute before the previous one began)
    touched = touched_since(engine, admitted.since)
    assert invented in touched and run.write not in touched
    assert (admitted.operations, admitted.calls) == (len(touched), 1)
    assert exporter_gauges(collector) == checked(capsys) == only(I1=1, I4=1, I5=1, I7=1)

    # When a pass runs three quarters of an hour on (the database clock told so)
    later_now = admitted.now + WINDOW - 900.0
    with engine.connect() as conn, conn.begin():
        later = collector.passes.watch.run(conn, now=later_now)
        expected = check(conn, since=later_now - WINDOW, stuck_after_seconds=STUCK_AFTER).counts()

    # Then the run's violations (touched, or the rejected call written, an hour before)
    # left the window, as they leave the check's; the recent ones stay
    assert dict(later.violations) == {code: expected[code] for code in WATCHED}
    assert dict(later.violations) == {"I1": 0, "I3": 0, "I4": 1, "I5": 1, "I6": 0, "I7": 0}


def test_pass__fails_midway__keeps_nothing_and_the_next_reads_from_the_last_completed(
    run: Run, engine: Engine, collector: DatabaseCollector, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a first pass, then violations planted now (I5, and I7 with its I4)
    first = collector.passes.run_once()
    fresh = now_of(engine, run)
    with engine.begin() as conn:
        plant_i5(conn, fresh)
        plant_i7(conn, fresh)

    # When the next pass fails after judging the operations, reading the calls
    def unreadable(*_args: object, **_kwargs: object) -> Iterator[object]:
        raise OSError("connection lost")
        yield

    with monkeypatch.context() as patched, pytest.raises(OSError):
        patched.setattr(invariant_watch, "call_chunks", unreadable)
        collector.passes.run_once()

    # Then nothing of it is kept: the gauges are the first pass's, the failure counted
    assert collector.passes.watch.previous_start == first.now
    assert exporter_gauges(collector) == only()
    assert exporter_gauges(collector, "toolfence_exporter_invariant_pass_errors_total") == {"": 1}

    # And the pass after it reads from the first pass's start, and sees them all
    after = collector.passes.run_once()
    assert after.since == pytest.approx(first.now - 60.0)
    assert (after.operations, after.calls) == (2, 0)
    assert exporter_gauges(collector) == checked(capsys) == only(I4=1, I5=1, I7=1)
