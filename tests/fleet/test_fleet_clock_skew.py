"""Clock skew on workers and relays changes no outcome: the lease is on the database clock.

Two workers, one with its wall clock 10 minutes ahead and one 10 minutes behind,
and a relay 10 minutes ahead (libfaketime, as the partitions campaign runs them:
tests/chaos/netns.py). If a lease were judged on a worker's clock, the worker
behind would write leases already expired (another worker could take its
operation: a second generation, a second effect) and the one ahead leases that
never end. Every call must instead succeed in its first generation, with exactly
one effect each, and the audit times must be the database's.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from executor.store.engine import make_engine
from executor.store.schema import audit_events, operations
from ledger.tools import registry
from outbox.producer import enqueue
from outbox.results import wait_for_results
from tests.chaos.netns import FAKETIME_LIB, compile_clock_shim, faketime_env
from tests.fleet.fleetkit import call, context

pytestmark = pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="libfaketime is not installed "
                                "(scripts/ci-deps.sh installs it)")
OFFSETS = {("worker", 0): 600, ("worker", 1): -600, ("relay", 0): 600}


def _launcher(tmp_path: Path):  # type: ignore[no-untyped-def]
    shim = compile_clock_shim(tmp_path / "clock")

    def launch(role: str, index: int) -> tuple[Sequence[str], Mapping[str, str]]:
        clock = tmp_path / "clock" / f"{role}-{index}.faketime"
        clock.write_text(f"{OFFSETS.get((role, index), 0):+d}s\n")
        return (), faketime_env(shim, clock)

    return launch


def _logged_offset(log: str) -> float:
    """The worker's clock offset, from the timestamp of its `ready` line."""
    stamp = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ \S+ toolfence\.worker: toolfence worker ready",
                      log, re.M)
    assert stamp, log[-2000:]
    logged = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    return logged - time.time()


def _run_requests(engine, first: int, count: int) -> list[list]:  # type: ignore[no-untyped-def]
    for n in range(first, first + count):
        calls = [
            call("credit", "ledger.credit", account_id="acme-2", amount_cents=100),
            call("transfer", "ledger.transfer", source_account="acme-1", target_account="acme-2",
                 amount_cents=10),
            call("invoice", "ledger.create_invoice", account_id="acme-2", amount_cents=5),
            call("notice", "ledger.send_notice", account_id="acme-2", text=f"notice {n}"),
            call("read", "ledger.get_balance", account_id="acme-2"),
        ]
        with engine.begin() as conn:
            enqueue(conn, calls, context(f"req-skew-{n}"), registry)
    return [wait_for_results(engine, "acme", f"req-skew-{n}", timeout=90)
            for n in range(first, first + count)]


def test_workers_ten_minutes_ahead_and_behind__every_call_once_first_generation(
    settings, ledger, make_fleet, tmp_path: Path,
) -> None:
    # Given a worker 10 minutes ahead, a relay ahead and the reconciler on real time
    fleet = make_fleet(workers=1, concurrency=2, launcher=_launcher(tmp_path)).start()
    engine = make_engine(settings.database_url)
    # When requests of writes of every effect contract and a read run: on the worker
    # ahead alone, then with a worker 10 minutes behind beside it, then on that one alone
    outcomes = _run_requests(engine, 0, 6)
    behind = fleet.start_worker(1)
    fleet.wait_ready(90)
    (ahead,) = [m for m in fleet.by_role("worker") if m.index == 0]
    assert 540 < _logged_offset(ahead.log_text()) < 660
    assert -660 < _logged_offset(behind.log_text()) < -540
    outcomes += _run_requests(engine, 6, 6)
    os.killpg(ahead.pid, signal.SIGTERM)
    ahead.process.wait(60)
    outcomes += _run_requests(engine, 12, 6)
    # Then every call succeeded, each operation in its first generation (no lease
    # was taken from a worker whose clock is off), with exactly one effect
    assert all(s.status == "succeeded" for statuses in outcomes for s in statuses), fleet.logs()
    with engine.connect() as conn:
        rows = conn.execute(select(operations.c.operation_id, operations.c.generation)).all()
        stamps = [r.at for r in conn.execute(select(audit_events.c.at))]
    assert len(rows) == 18 * 5 and {r.generation for r in rows} == {1}, rows
    assert max(ledger.effects_per_operation().values()) == 1
    assert len(ledger.effects_per_operation()) == 18 * 4
    assert ledger.balance("acme-2") == 18 * (100 + 10)
    # And every audit time is the database's clock (real time), not a worker's
    now = time.time()
    assert all(abs(float(at) - now) < 300 for at in stamps), (min(stamps), max(stamps), now)
    engine.dispose()
