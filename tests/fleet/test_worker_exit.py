"""`toolfence worker` exits with the status Celery's worker chose (executor/cli/main.py).

It ran `app.worker_main`, which drops that status, and returned 0: a worker whose
main process stopped on an "Unrecoverable error" (seen in the chaos campaign when a
Redis reset met a late acknowledgement) exited 0, so a supervisor that restarts on
failure only (systemd's `Restart=on-failure`) left the fleet a worker short.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import pytest

from executor.cli.fleet import Fleet


def test_worker__unrecoverable_error__exits_1(
    make_fleet: Callable[..., Fleet], broker_url: str
) -> None:
    # Given a worker whose consumer cannot start: a Redis URL whose database is not
    # a number passes the settings and fails in kombu's connection, inside Celery's
    # worker, which logs "Unrecoverable error" and stops with EX_FAILURE
    fleet = make_fleet(
        workers=1, relays=0, reconcile_every=None,
        env={"TOOLFENCE_BROKER_URL": broker_url.rsplit("/", 1)[0] + "/not-a-number"},
    )

    # When it starts
    with pytest.raises(RuntimeError, match="worker 0 exited"):
        fleet.start(wait_ready=60.0)
    [worker] = fleet.members
    returned = worker.process.wait(timeout=30)

    # Then it says so in its exit status, not only in its log
    assert "Unrecoverable error" in worker.log_text()
    assert returned == 1, worker.log_text()


def test_worker__sigterm__warm_shutdown_exits_0(make_fleet: Callable[..., Fleet]) -> None:
    # Given a running worker (real PostgreSQL, real Redis)
    fleet = make_fleet(workers=1, relays=0, reconcile_every=None)
    fleet.start()
    [worker] = fleet.by_role("worker")

    # When its main process is told to stop
    worker.process.send_signal(signal.SIGTERM)
    try:
        returned = worker.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not stop after SIGTERM:\n{worker.log_text()}")

    # Then a warm shutdown is a clean stop, as supervisors and the demo expect
    assert returned == 0, worker.log_text()
