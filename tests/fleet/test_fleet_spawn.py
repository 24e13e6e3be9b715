"""Starting a fleet member is not interruptible half-way (executor/cli/fleet.py).

A SIGTERM that lands while `Popen` is starting a member (after the fork, before it
returns) used to raise out of `_spawn` before the member was recorded: `stop()` never
heard of it and a worker with its pool child outlived the demo (seen in CI as
`test_demo__interrupted__...[sigterm-during-startup]`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.cli import fleet as fleet_module
from executor.cli.fleet import Fleet, process_alive


class _Terminated(Exception):
    pass


@pytest.fixture
def raising_sigterm() -> Iterator[None]:
    """SIGTERM raises in the main thread, as `toolfence demo` makes it do."""

    def on_term(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_spawn__sigterm_while_popen_starts_the_member__member_recorded_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raising_sigterm: None
) -> None:
    # Given a Popen during which SIGTERM arrives, once the child exists
    real_popen = subprocess.Popen
    started: list[int] = []

    def popen_then_sigterm(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process = real_popen(*args, **kwargs)
        started.append(process.pid)
        os.kill(os.getpid(), signal.SIGTERM)
        return process

    monkeypatch.setattr(fleet_module.subprocess, "Popen", popen_then_sigterm)
    fleet = Fleet(env={"TOOLFENCE_HOME": str(tmp_path / "home")}, log_dir=tmp_path / "logs")

    # When the fleet starts its reconciler (a long-running member) and is told to stop
    with pytest.raises(_Terminated):
        fleet.start_reconciler()

    # Then the signal is still delivered, but only once the member is recorded, so
    # stop() ends it: nothing outlives the fleet
    assert [m.pid for m in fleet.members] == started
    assert fleet.members[0].alive()
    fleet.stop(timeout=5.0)
    assert not process_alive(started[0])


def test_wait_ready__log_holds_an_earlier_workers_ready_line__waits_for_this_ones(
    tmp_path: Path,
) -> None:
    # Given a log directory an earlier fleet wrote to: worker 0 said it was ready
    logs = tmp_path / "logs"
    logs.mkdir()
    earlier = "[worker] toolfence worker ready (pid 1)\n"
    (logs / "worker-0.log").write_text(earlier)
    # and a new worker 0 that cannot start (its home has no database)
    fleet = Fleet(
        env={"TOOLFENCE_HOME": str(tmp_path / "home")},
        log_dir=logs, workers=1, relays=0, reconcile_every=None,
    )
    try:
        # When the fleet starts and waits for its workers
        with pytest.raises(RuntimeError, match="worker 0 exited"):
            fleet.start(wait_ready=30.0)
    finally:
        fleet.stop(timeout=5.0)

    # Then the earlier process's line did not count as this one's: the new worker's
    # own output is what it wrote after it, and the log keeps both
    [member] = fleet.members
    assert member.log_start == len(earlier)
    assert "toolfence worker ready" not in member.log_text()
    assert "no database" in member.log_text()
    assert member.log_path.read_text().startswith(earlier)
