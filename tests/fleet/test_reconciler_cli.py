"""`toolfence reconcile` as cron and systemd run it: one sweep and exit, or `--every` until SIGTERM."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from reconciler_kit import (
    TOOLS_ENV,
    stale_operations,
    start_toolfence,
    state_of,
    toolfence,
    wait_leases_expired,
    wait_until,
)
from sqlalchemy import Engine

from executor.store.engine import make_engine

NOTICE = ("ledger.send_notice", {"account_id": "acme-1", "text": "hello"})


@pytest.fixture
def cli_env(pg_url: str, tmp_path: Path) -> dict[str, str]:
    """Only a database: the reconciler needs no broker (it republishes through the outbox)."""
    return {
        **TOOLS_ENV,
        "TOOLFENCE_DATABASE_URL": pg_url,
        "TOOLFENCE_HOME": str(tmp_path / "home"),
        "PROMETHEUS_MULTIPROC_DIR": "",
    }


@pytest.fixture
def db(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def test_reconcile__empty_database__exits_0_and_prints_an_empty_report(cli_env: dict[str, str]) -> None:
    # Given a migrated, empty database; when one sweep runs
    result = toolfence(cli_env, "reconcile")
    # Then it exits 0 and prints a report of nothing done
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["actions"] == {}
    assert isinstance(report["seconds"], float)
    assert result.stderr == ""


def test_reconcile__one_sweep__settles_what_is_stale_and_reports_it(
    cli_env: dict[str, str], db: Engine
) -> None:
    # Given two unsafe writes whose workers died
    stale = stale_operations(db, [NOTICE, NOTICE])
    wait_leases_expired(db)
    # When one sweep runs
    result = toolfence(cli_env, "reconcile")
    # Then both wait for a person, and the report says so
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["actions"] == {"marked_pending": 2}
    assert {state_of(db, operation_id) for operation_id, _ in stale} == {"reconciliation_pending"}


def test_reconcile_every__sweeps_until_sigterm_then_exits_0(cli_env: dict[str, str], db: Engine) -> None:
    # Given a stale operation, and `toolfence reconcile --every 0.2` running
    [(first, _)] = stale_operations(db, [NOTICE])
    wait_leases_expired(db)
    process = start_toolfence(cli_env, "reconcile", "--every", "0.2")
    try:
        wait_until(lambda: state_of(db, first) == "reconciliation_pending", timeout=30,
                   what="the first sweep")
        # When another operation goes stale after that first sweep
        [(second, _)] = stale_operations(db, [NOTICE])
        # Then a later sweep settles it too: the command loops
        wait_until(lambda: state_of(db, second) == "reconciliation_pending", timeout=10,
                   what="a later sweep")
        assert process.poll() is None
        # When it receives SIGTERM, it stops promptly and cleanly
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_reconcile__database_unreachable__one_line_and_a_nonzero_exit(cli_env: dict[str, str]) -> None:
    # Given a database URL nothing listens on; when one sweep runs
    result = toolfence(
        {**cli_env, "TOOLFENCE_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/none"},
        "reconcile",
    )
    # Then it says so in one line, without a traceback, and exits non-zero (cron mails it)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "database" in result.stderr

