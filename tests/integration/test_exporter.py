"""The exporter: database gauges against direct counts, multiprocess aggregation
over real HTTP, and a database outage that must not take the exporter down.

Runs on SQLite and PostgreSQL (`db_url`); a missing PostgreSQL fails loudly.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, Engine, insert, select

from executor import store
from executor.settings import Settings
from executor.store.clock import db_now
from executor.store.invariant_check import check
from executor.store.schema import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    approvals,
    calls,
    operations,
    outbox,
    receipts,
    turns,
)
from executor.telemetry.exporter import (
    DatabaseCollector,
    ExporterConfig,
    RunningExporter,
    mark_process_dead,
    prepare_multiprocess_dir,
    start,
)

STUCK_AFTER = 600.0
WINDOW = 3600.0
CONFIG = ExporterConfig(stuck_after_seconds=STUCK_AFTER, invariant_window_seconds=WINDOW)
# The database clock moves between inserting the rows and scraping them.
AGE_TOLERANCE = 30.0


# ----------------------------------------------------------------- helpers


def _operation(now: float, operation_id: str, state: str, **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "operation_id": operation_id,
        "request_id": overrides.pop("request_id", f"req-{operation_id}"),
        "call_id": f"call-{operation_id}",
        "position": 0,
        "tool_name": "ledger.refund",
        "schema_version": 1,
        "mode": "write",
        "state": state,
        "generation": 1,
        "intent_hash": "0" * 64,
        "arguments": "{}",
        "context": "{}",
        "attempts": 1,
        "available_at": now,
        "queued_at": now if state == "queued" else None,
        "created_at": now - 1000,
        "updated_at": now,
        # Every row names the same columns: one executemany inserts them all.
        "lease_expires_at": None,
        "started_at": None,
        "finished_at": None,
    }
    row.update(overrides)
    return row


def _receipt(now: float, operation_id: str, receipt: str, *, accepted: bool = True,
             age: float = 10.0) -> dict[str, Any]:
    return {
        "operation_id": operation_id,
        "generation": 1,
        "receipt": receipt,
        "accepted": accepted,
        "source": "worker",
        "recorded_at": now - age,
    }


def _call(now: float, call_id: str, *, operation_id: str | None, result: str | None,
          tool_name: str = "ledger.refund", age: float = 10.0) -> dict[str, Any]:
    return {
        "request_id": "req-calls",
        "call_id": call_id,
        "position": 0,
        "tool_name": tool_name,
        "operation_id": operation_id,
        "gate": None if result is None else "schema",
        "result": result,
        "created_at": now - age,
    }


def fill_every_state(conn: Connection) -> float:
    """Operations in every state, plus outbox rows, receipts, calls and approvals.

    Returns the database time the rows were written against.
    """
    now = float(conn.execute(select(db_now())).scalar_one())
    ops = [
        _operation(now, "done-1", "succeeded", finished_at=now - 5),
        _operation(now, "done-2", "succeeded", finished_at=now - 5),
        _operation(now, "done-3", "succeeded", finished_at=now - 5),
        _operation(now, "failed-1", "failed_terminal", finished_at=now - 5),
        _operation(now, "failed-2", "failed_terminal", finished_at=now - 5),
        # queued: fresh; overdue and runnable (stuck); overdue but waiting behind an
        # earlier write of its request that is still running (not stuck).
        _operation(now, "queued-fresh", "queued", available_at=now - 5),
        _operation(now, "queued-overdue", "queued", available_at=now - 700),
        _operation(now, "pred", "started", request_id="req-ordered", position=0,
                   lease_expires_at=now + 10, started_at=now - 20),
        _operation(now, "queued-blocked", "queued", request_id="req-ordered", position=1,
                   available_at=now - 700),
        # started: live lease; lease expired recently (the reconciler's job, not yet
        # stuck); lease expired long ago (stuck).
        _operation(now, "started-live", "started", lease_expires_at=now + 10,
                   started_at=now - 30),
        _operation(now, "started-expired", "started", lease_expires_at=now - 60,
                   started_at=now - 100),
        _operation(now, "started-stuck", "started", lease_expires_at=now - 700,
                   started_at=now - 800),
        _operation(now, "retry-waiting", "retry_wait", available_at=now + 30),
        _operation(now, "retry-overdue", "retry_wait", available_at=now - 900),
        _operation(now, "pending-recent", "reconciliation_pending", updated_at=now - 50),
        _operation(now, "pending-old", "reconciliation_pending", updated_at=now - 5000),
        _operation(now, "approval-fresh", "pending_approval", generation=0),
        _operation(now, "approval-expired", "pending_approval", generation=0),
    ]
    conn.execute(insert(operations), ops)
    conn.execute(
        insert(approvals),
        [
            {"approval_id": f"apr-{op}", "operation_id": op, "intent_hash": "0" * 64,
             "impact": "{}", "state": "pending", "requested_at": now - 2000,
             "expires_at": now + expires}
            for op, expires in (("approval-fresh", 1000), ("approval-expired", -1000))
        ],
    )
    conn.execute(
        insert(outbox),
        [
            {"operation_id": "queued-fresh", "created_at": now - 10, "published_at": None,
             "next_attempt_at": now},
            {"operation_id": "queued-overdue", "created_at": now - 40, "published_at": None,
             "next_attempt_at": now},
            {"operation_id": "retry-waiting", "created_at": now - 5, "published_at": None,
             "next_attempt_at": now},
            {"operation_id": "done-1", "created_at": now - 9999, "published_at": now - 9998,
             "next_attempt_at": now - 9999},
            {"operation_id": "done-2", "created_at": now - 9999, "published_at": now - 9998,
             "next_attempt_at": now - 9999},
        ],
    )
    conn.execute(
        insert(receipts),
        [
            _receipt(now, "done-1", "r-1"),
            # The same receipt seen twice (worker and reconciler): one effect.
            _receipt(now, "done-2", "r-2"),
            _receipt(now, "done-2", "r-2"),
            # Two distinct accepted effects: I1.
            _receipt(now, "done-3", "r-3a"),
            _receipt(now, "done-3", "r-3b", age=5),
            # A stale owner's refused effect does not count.
            _receipt(now, "started-stuck", "r-4"),
            _receipt(now, "started-stuck", "r-4-stale", accepted=False),
            # An I1 violation older than the window: only the full-history check sees it.
            _receipt(now, "failed-1", "r-5a", age=2 * WINDOW),
            _receipt(now, "failed-1", "r-5b", age=2 * WINDOW),
        ],
    )
    conn.execute(
        insert(calls),
        [
            _call(now, "c-admitted", operation_id="done-1", result=None),
            _call(now, "c-rejected", operation_id=None, result='{"status":"failed_terminal"}'),
            # Stored result and an operation of another tool: the stored result answers.
            _call(now, "c-conflict", operation_id="done-2", result='{"status":"failed_terminal"}',
                  tool_name="ledger.lookup"),
            # I6: neither a stored result nor an operation.
            _call(now, "c-unanswered", operation_id=None, result=None),
            # I6: an operation id that does not exist.
            _call(now, "c-dangling", operation_id="op-missing", result=None),
            # I6: the result would come from an operation of another tool.
            _call(now, "c-wrong-tool", operation_id="done-3", result=None,
                  tool_name="ledger.lookup"),
            # I6 older than the window.
            _call(now, "c-old-unanswered", operation_id=None, result=None, age=2 * WINDOW),
        ],
    )
    return now


def direct_counts(conn: Connection) -> dict[str, Any]:
    """The gauges computed the naive way: every row into Python, no index, no window."""
    now = float(conn.execute(select(db_now())).scalar_one())
    ops = {r.operation_id: r for r in conn.execute(select(operations))}
    states = Counter(r.state for r in ops.values())
    unpublished = [r for r in conn.execute(select(outbox)) if r.published_at is None]
    started = [r.started_at for r in ops.values() if r.state == "started"]
    pending = [r.updated_at for r in ops.values() if r.state == "reconciliation_pending"]
    waiting = [r.created_at for r in ops.values() if r.state == "pending_approval"]
    return {
        "toolfence_outbox_backlog": len(unpublished),
        "toolfence_outbox_oldest_unpublished_age_seconds":
            now - min(r.created_at for r in unpublished) if unpublished else 0.0,
        "active": {s: states.get(s, 0) for s in ACTIVE_STATES},
        "toolfence_oldest_started_age_seconds": now - min(started) if started else 0.0,
        "toolfence_reconciliation_pending": len(pending),
        "toolfence_reconciliation_pending_oldest_age_seconds":
            now - min(pending) if pending else 0.0,
        "toolfence_approvals_waiting_oldest_age_seconds": now - min(waiting) if waiting else 0.0,
        "terminal": sum(states.get(s, 0) for s in TERMINAL_STATES),
    }


def scrape_http(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.status == 200
        body = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def exporter_for(request: pytest.FixtureRequest) -> Iterator[Any]:
    started: list[RunningExporter] = []

    def _start(settings: Settings, *, first_pass: bool = True,
               config: ExporterConfig = CONFIG) -> RunningExporter:
        running = start(settings, 0, "127.0.0.1", config)
        started.append(running)
        # The invariant gauges come from the passes' thread: its first pass, at start.
        if first_pass:
            assert running.database.passes.wait_for(1, timeout=60), running.database.passes.status()
        return running

    yield _start
    for running in started:
        running.stop()


# ----------------------------------------------------------------- database gauges


def test_metrics__operations_in_every_state__gauges_match_direct_counts(
    db_url: str, engine: Engine, exporter_for: Any
) -> None:
    # Given operations in every state, outbox rows, receipts, calls and approvals
    with engine.begin() as conn:
        fill_every_state(conn)
    with engine.connect() as conn:
        expected = direct_counts(conn)

    # When Prometheus scrapes the exporter over HTTP
    running = exporter_for(Settings(database_url=db_url, broker_url="memory://"))
    samples = scrape_http(running.port)

    # Then every gauge equals the direct count
    assert value(samples, "toolfence_exporter_database_up") == 1.0
    assert value(samples, "toolfence_exporter_scrape_errors_total") == 0.0
    assert value(samples, "toolfence_outbox_backlog") == expected["toolfence_outbox_backlog"] == 3
    for state in ACTIVE_STATES:
        assert value(samples, "toolfence_operations_active", state=state) == expected["active"][state]
    assert expected["active"] == {
        "pending_approval": 2, "queued": 3, "started": 4, "retry_wait": 2,
        "reconciliation_pending": 2,
    }
    # Terminal states are not a gauge: their rates come from the terminal counter.
    exported_states = {labels for (name, labels) in samples if name == "toolfence_operations_active"}
    assert exported_states == {(("state", s),) for s in ACTIVE_STATES}
    assert expected["terminal"] == 5
    assert value(samples, "toolfence_reconciliation_pending") == 2
    for age in (
        "toolfence_outbox_oldest_unpublished_age_seconds",
        "toolfence_oldest_started_age_seconds",
        "toolfence_reconciliation_pending_oldest_age_seconds",
        "toolfence_approvals_waiting_oldest_age_seconds",
    ):
        assert value(samples, age) == pytest.approx(expected[age], abs=AGE_TOLERANCE), age
    assert expected["toolfence_oldest_started_age_seconds"] == pytest.approx(800, abs=AGE_TOLERANCE)
    assert expected["toolfence_reconciliation_pending_oldest_age_seconds"] == pytest.approx(
        5000, abs=AGE_TOLERANCE
    )
    # Waiting since admission (created_at), not since the row was last written (updated_at, now)
    assert expected["toolfence_approvals_waiting_oldest_age_seconds"] == pytest.approx(
        1000, abs=AGE_TOLERANCE
    )

    # And the stuck operations and invariant violations are exactly the planted ones
    assert {s: value(samples, "toolfence_operations_stuck", state=s) for s in
            ("pending_approval", "queued", "started", "retry_wait")} == {
        "pending_approval": 1, "queued": 1, "started": 1, "retry_wait": 1,
    }
    assert value(samples, "toolfence_invariant_violations", invariant="I1") == 1
    assert value(samples, "toolfence_invariant_violations", invariant="I2") == 4
    assert value(samples, "toolfence_invariant_violations", invariant="I6") == 3
    assert value(samples, "toolfence_exporter_scrape_duration_seconds") > 0
    # And the gauges of the pass they come from: it judged the window's operations and calls
    assert value(samples, "toolfence_exporter_invariant_pass_judged", subject="calls") == 6
    assert value(samples, "toolfence_exporter_invariant_pass_judged", subject="operations") > 0
    assert value(samples, "toolfence_exporter_invariant_pass_duration_seconds") > 0
    assert value(samples, "toolfence_exporter_invariant_pass_age_seconds") >= 0
    assert value(samples, "toolfence_exporter_invariant_pass_errors_total") == 0


def test_invariant_gauges__the_window__all_history_counts_more(db_url: str, engine: Engine) -> None:
    # Given violations planted inside and outside the exporter's window
    with engine.begin() as conn:
        fill_every_state(conn)

    # When the exporter's first pass judges its window, and the check all history
    collector = DatabaseCollector(db_url, CONFIG)
    try:
        collector.passes.run_once()
        windowed = {
            sample.labels["invariant"]: sample.value
            for family in collector.collect() if family.name == "toolfence_invariant_violations"
            for sample in family.samples
        }
    finally:
        collector.close()
    with engine.connect() as conn:
        everything = check(conn, since=None, stuck_after_seconds=STUCK_AFTER).counts()

    # Then the old ones count only without the window (the planted rows have no audit
    # trail and few call rows, so I4 and I5 count too: tests/integration/test_check.py
    # plants each invariant's violation on its own)
    assert set(windowed) == set(everything) == {"I1", "I2", "I3", "I4", "I5", "I6", "I7"}
    assert {code: windowed[code] for code in ("I1", "I2", "I6")} == {"I1": 1, "I2": 4, "I6": 3}
    assert {code: everything[code] for code in ("I1", "I2", "I6")} == {"I1": 2, "I2": 4, "I6": 4}


def test_metrics__violation_written_while_running__a_later_pass_serves_it(
    db_url: str, engine: Engine, exporter_for: Any
) -> None:
    # Given an exporter whose passes run every few hundredths of a second, on a clean database
    running = exporter_for(
        Settings(database_url=db_url, broker_url="memory://"),
        config=ExporterConfig(invariant_interval_seconds=0.05),
    )
    assert value(scrape_http(running.port), "toolfence_invariant_violations", invariant="I1") == 0

    # When an operation's second accepted effect is recorded (I1)
    with engine.begin() as conn:
        now = float(conn.execute(select(db_now())).scalar_one())
        conn.execute(insert(receipts), [_receipt(now, "op-twice", "r-a"), _receipt(now, "op-twice", "r-b")])
    # (the pass under way may have taken its snapshot before: wait for the one after it)
    passes = running.database.passes
    assert passes.wait_for(passes.status().completed + 2, timeout=60)

    # Then a scrape after the next pass serves it, from a pass that judged only that operation
    samples = scrape_http(running.port)
    assert value(samples, "toolfence_invariant_violations", invariant="I1") == 1
    assert value(samples, "toolfence_exporter_invariant_pass_judged", subject="operations") == 1


def test_metrics__empty_database__every_gauge_present_and_zero(
    db_url: str, exporter_for: Any
) -> None:
    running = exporter_for(Settings(database_url=db_url, broker_url="memory://"))

    samples = scrape_http(running.port)

    # Alert expressions need the series to exist even when nothing is wrong.
    for invariant in ("I1", "I2", "I3", "I4", "I5", "I6", "I7"):
        assert value(samples, "toolfence_invariant_violations", invariant=invariant) == 0
    for state in ACTIVE_STATES:
        assert value(samples, "toolfence_operations_active", state=state) == 0
    assert value(samples, "toolfence_outbox_backlog") == 0
    assert value(samples, "toolfence_outbox_oldest_unpublished_age_seconds") == 0
    assert value(samples, "toolfence_oldest_started_age_seconds") == 0
    assert value(samples, "toolfence_reconciliation_pending_oldest_age_seconds") == 0
    assert value(samples, "toolfence_approvals_waiting_oldest_age_seconds") == 0
    assert value(samples, "toolfence_turns_active", state="running") == 0
    assert value(samples, "toolfence_turns_active", state="waiting_approval") == 0


def _turn(now: float, turn_id: str, state: str) -> dict[str, Any]:
    return {
        "turn_id": turn_id, "tenant": "t", "principal": "p", "conversation_id": turn_id,
        # One running turn per (tenant, scope_key): a scope of its own each.
        "scope_key": turn_id, "context": "{}", "message": "m", "driver": "d", "options": "{}",
        "state": state, "created_at": now, "updated_at": now,
    }


def test_metrics__turns_in_every_state__running_and_waiting_counted(
    db_url: str, engine: Engine, exporter_for: Any
) -> None:
    # Given turns running, waiting for an approval and ended
    with engine.begin() as conn:
        now = float(conn.execute(select(db_now())).scalar_one())
        conn.execute(insert(turns), [
            _turn(now, "run-1", "running"), _turn(now, "run-2", "running"),
            _turn(now, "wait-1", "waiting_approval"),
            _turn(now, "done-1", "succeeded"), _turn(now, "failed-1", "failed"),
        ])

    # When the exporter is scraped
    samples = scrape_http(exporter_for(Settings(database_url=db_url, broker_url="memory://")).port)

    # Then only the live turns count, by state; ended ones are the counter's
    assert value(samples, "toolfence_turns_active", state="running") == 2
    assert value(samples, "toolfence_turns_active", state="waiting_approval") == 1
    exported = {labels for (name, labels) in samples if name == "toolfence_turns_active"}
    assert exported == {(("state", "running"),), (("state", "waiting_approval"),)}


def _queued_behind(
    engine: Engine,
    earlier_state: str,
    earlier: Callable[[float], dict[str, Any]],
    later: dict[str, Any],
) -> None:
    """A request of two calls: the earlier one in `earlier_state` (more fields from
    `earlier(now)`), then `later`, queued long past due."""
    with engine.begin() as conn:
        now = float(conn.execute(select(db_now())).scalar_one())
        conn.execute(insert(operations), [
            _operation(now, "earlier", earlier_state, request_id="req-two", position=0,
                       **earlier(now)),
            _operation(now, "later", "queued", request_id="req-two", position=1,
                       available_at=now - 700, queued_at=now - 700, **later),
        ])


def _stuck_queued(db_url: str, engine: Engine, exporter_for: Any) -> tuple[float, float, list[str]]:
    """The stuck gauge for `queued`, I2, and what the store's reconciler would republish."""
    running = exporter_for(Settings(database_url=db_url, broker_url="memory://"))
    samples = scrape_http(running.port)
    with engine.connect() as conn:
        republished = store.stale_queued(conn, STUCK_AFTER, 10)
    return (
        value(samples, "toolfence_operations_stuck", state="queued"),
        value(samples, "toolfence_invariant_violations", invariant="I2"),
        republished,
    )


READ = {"mode": "read", "tool_name": "ledger.get_balance"}


def test_metrics__read_overdue_behind_reconciliation_pending_write__counted_stuck(
    db_url: str, engine: Engine, exporter_for: Any
) -> None:
    # Given a read queued long past due behind a write that went to
    # reconciliation_pending: settled, so the store runs the read (it sees the state
    # as it is) and a worker should have taken it
    _queued_behind(engine, "reconciliation_pending", lambda now: {}, READ)

    # When Prometheus scrapes the exporter
    stuck, i2, republished = _stuck_queued(db_url, engine, exporter_for)

    # Then the read is stuck and I2 shows it, as the store's predicate says it is due
    assert (stuck, i2) == (1, 1)
    assert republished == ["later"]


def test_metrics__write_behind_read_holding_its_lease__not_stuck(
    db_url: str, engine: Engine, exporter_for: Any
) -> None:
    # Given a write queued long past due behind a read that still holds its lease:
    # a write waits for every earlier call, so it has no message by design
    _queued_behind(
        engine, "started", lambda now: {"lease_expires_at": now + 60, "started_at": now - 5, **READ},
        {},
    )

    # When Prometheus scrapes the exporter
    stuck, i2, republished = _stuck_queued(db_url, engine, exporter_for)

    # Then nothing is stuck (no false page), and the store does not republish it either
    assert (stuck, i2) == (0, 0)
    assert republished == []


# ----------------------------------------------------------------- database outage


@pytest.mark.parametrize(
    "database_url",
    [
        # Nothing listens on port 1: connection refused.
        "postgresql+psycopg://postgres@127.0.0.1:1/toolfence",
        # A database that does not exist on a live server.
        "postgresql+psycopg://postgres@127.0.0.1:5432/toolfence_no_such_database",
        "sqlite:////nonexistent/dir/toolfence.db",
    ],
    ids=["refused", "no-database", "sqlite-missing"],
)
def test_metrics__database_unreachable__scrape_succeeds_and_counts_errors(
    database_url: str, exporter_for: Any
) -> None:
    # Given an exporter whose database is out
    running = exporter_for(Settings(database_url=database_url, broker_url="memory://"), first_pass=False)

    # When it is scraped twice
    first = scrape_http(running.port)
    second = scrape_http(running.port)

    # Then both scrapes answer 200, report the outage, and leave the gauges out
    # (the invariant passes' own age is served: it grows until a pass completes)
    assert value(first, "toolfence_exporter_database_up") == 0.0
    assert value(second, "toolfence_exporter_invariant_pass_age_seconds") >= 0
    assert ("toolfence_exporter_invariant_pass_duration_seconds", ()) not in second
    assert value(first, "toolfence_exporter_scrape_errors_total") == 1.0
    assert value(second, "toolfence_exporter_scrape_errors_total") == 2.0
    assert not any(name == "toolfence_invariant_violations" for name, _ in second)
    assert running.thread.is_alive()


def test_metrics__database_goes_away_and_returns__exporter_recovers(
    pg_url: str, exporter_for: Any
) -> None:
    import psycopg

    base, dbname = pg_url.rsplit("/", 1)
    admin_dsn = base.replace("postgresql+psycopg://", "postgresql://", 1) + "/postgres"
    running = exporter_for(Settings(database_url=pg_url, broker_url="memory://"))
    assert value(scrape_http(running.port), "toolfence_exporter_database_up") == 1.0

    # When the database refuses connections (and its pooled one is killed) …
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (dbname,),
        )
    try:
        down = scrape_http(running.port)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')

    # … the scrape reports it, and the next one after it returns reads again
    assert value(down, "toolfence_exporter_database_up") == 0.0
    back = scrape_http(running.port)
    assert value(back, "toolfence_exporter_database_up") == 1.0
    assert value(back, "toolfence_exporter_scrape_errors_total") == 1.0


# ----------------------------------------------------------------- multiprocess


def count_invocations(metrics_dir: str, tool: str, times: int) -> None:
    """Runs in a spawned child: a worker process counting handler invocations."""
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == metrics_dir
    from executor.telemetry.metrics import HANDLER_INVOCATIONS
    from tests.metrickit import declare_tools

    declare_tools(tool)  # a worker's registry holds the tools it counts
    for _ in range(times):
        HANDLER_INVOCATIONS.labels(tool=tool).inc()


@pytest.mark.parametrize("layout", ["flat", "per-container"])
def test_metrics__two_worker_processes__exporter_serves_the_sum(
    layout: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    exporter_for: Any,
) -> None:
    # Given a fresh multiprocess directory (stale files from an earlier fleet removed)
    root = prepare_multiprocess_dir(tmp_path / "metrics")
    (root / "counter_999999.db").write_bytes(b"stale")
    prepare_multiprocess_dir(root)
    assert not list(root.glob("*.db"))

    # When two spawned processes count invocations into it (flat: one directory as on
    # one host; per-container: a subdirectory each, as containers sharing a volume)
    spawn = multiprocessing.get_context("spawn")
    children = []
    for index, (tool, times) in enumerate((("ledger.refund", 3), ("ledger.refund", 4))):
        directory = root if layout == "flat" else root / f"container-{index}"
        directory.mkdir(exist_ok=True)
        # The child reads the variable when it is started, so each gets its own.
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        child = spawn.Process(target=count_invocations, args=(str(directory), tool, times))
        child.start()
        children.append(child)
    # A second process in the last directory, counting another tool.
    extra = spawn.Process(target=count_invocations, args=(str(directory), "ledger.lookup", 2))
    extra.start()
    children.append(extra)
    for child in children:
        child.join(timeout=120)
        assert child.exitcode == 0

    # Then the exporter's /metrics, over real HTTP, shows the sum across processes
    running = exporter_for(
        Settings(database_url=sqlite_url, broker_url="memory://", metrics_dir=str(root))
    )
    samples = scrape_http(running.port)
    assert value(samples, "toolfence_handler_invocations_total", tool="ledger.refund") == 7.0
    assert value(samples, "toolfence_handler_invocations_total", tool="ledger.lookup") == 2.0
    # … next to the database gauges
    assert value(samples, "toolfence_exporter_database_up") == 1.0


def test_metrics__a_process_creating_its_file_during_a_scrape__scrape_serves_the_rest(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter_for: Any,
) -> None:
    # Given a directory where a finished process counted 3 invocations
    root = prepare_multiprocess_dir(tmp_path / "metrics")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(root))
    child = multiprocessing.get_context("spawn").Process(
        target=count_invocations, args=(str(root), "ledger.refund", 3)
    )
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    # ... and a process that has just created its file but not yet sized it (prometheus
    # -client opens, then truncates: a pool child forked while a scrape reads the folder)
    (root / "counter_424242.db").write_bytes(b"")
    (root / "histogram_424242.db").write_bytes(b"")

    # When the exporter is scraped over HTTP
    running = exporter_for(
        Settings(database_url=sqlite_url, broker_url="memory://", metrics_dir=str(root))
    )
    samples = scrape_http(running.port)

    # Then the scrape succeeds with the finished process's counts
    assert value(samples, "toolfence_handler_invocations_total", tool="ledger.refund") == 3.0


def test_mark_process_dead__removes_only_live_gauge_files(tmp_path: Path) -> None:
    for name in ("gauge_livesum_4242.db", "gauge_liveall_4242.db", "counter_4242.db",
                 "gauge_livesum_7.db"):
        (tmp_path / name).write_bytes(b"")

    mark_process_dead(4242, str(tmp_path))

    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_4242.db", "gauge_livesum_7.db"]


def test_mark_process_dead__not_multiprocess__does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given no multiprocess directory configured, and a dead pid's live gauge file
    # in the working directory (where a path-less call would look)
    from prometheus_client import multiprocess as prometheus_multiprocess

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gauge_livesum_4242.db").write_bytes(b"")
    forwarded: list[tuple[Any, ...]] = []
    monkeypatch.setattr(prometheus_multiprocess, "mark_process_dead", lambda *a: forwarded.append(a))

    # When the exit hook runs
    mark_process_dead(4242)

    # Then nothing is forwarded to prometheus_client and no file is touched
    assert forwarded == []
    assert [p.name for p in tmp_path.iterdir()] == ["gauge_livesum_4242.db"]


def test_prepare_multiprocess_dir__keeps_files_that_are_not_metrics(tmp_path: Path) -> None:
    (tmp_path / "counter_1.db").write_bytes(b"")
    (tmp_path / "container-a").mkdir()
    (tmp_path / "container-a" / "histogram_2.db").write_bytes(b"")
    (tmp_path / "README").write_text(json.dumps("keep me"))

    prepare_multiprocess_dir(tmp_path)

    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["README"]
