"""`toolfence demo` on the embedded default (SQLite + filesystem transport), for real.

The demo is run as a user runs it: a subprocess, its own TOOLFENCE_HOME, no
server. Its processes are found through /proc by the temporary directory their
environment names, so a leaked worker cannot hide.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.polling import eventually

pytestmark = pytest.mark.slow

INVARIANTS = ("I1", "I2", "I3", "I4", "I5", "I6", "I7")


def _demo_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFENCE_", "PROMETHEUS_"))}
    env["TOOLFENCE_HOME"] = str(home)
    env["COLUMNS"] = "200"
    return env


def _start_demo(home: Path, output: Path, *args: str) -> subprocess.Popen[bytes]:
    with output.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "executor.cli", "demo", *args],
            env=_demo_env(home), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )


def _processes_mentioning(marker: str, exclude: int | None = None) -> list[str]:
    """Live (non-zombie) processes whose environment or command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), exclude):
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if state != "Z" and (marker.encode() in environ or marker.encode() in cmdline):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {command}")
    return found


def _wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """`eventually`, looking every 0.1 s by default (a look may scan /proc)."""
    return eventually(predicate, timeout, interval)


def _row(output: str, label: str) -> str:
    """The summary table's row whose first cell starts with `label`."""
    lines = [line for line in output.splitlines() if re.match(rf"\s*│\s+{re.escape(label)}\b", line)]
    assert lines, f"no table row for {label!r} in:\n{output}"
    return lines[0]


def test_demo__embedded_default__every_invariant_passes_and_nothing_is_left_running(tmp_path: Path) -> None:
    # Given a bare machine: no database or broker configured, a fresh TOOLFENCE_HOME
    home = tmp_path / "home"
    output = tmp_path / "demo.out"
    # When a user runs the demo with a small workload
    started = time.monotonic()
    demo = _start_demo(home, output, "--calls", "60")
    returncode = demo.wait(timeout=240)
    seconds = time.monotonic() - started
    text = output.read_text(errors="replace")
    # Then it succeeds, and says why it believes it did
    assert returncode == 0, text
    assert "Traceback" not in text, text
    for code in INVARIANTS:
        assert "PASS" in _row(text, code), text
    assert "FAIL" not in text, text
    assert "All invariants hold." in text
    # The table shows operations by final state, side effects, faults and gates
    assert int(_row(text, "succeeded").split("│")[2]) > 0
    for label in ("failed_terminal", "reconciliation_pending", "lease takeovers", "fenced stale writes",
                  "with 1 effect", "allowlist", "parse", "schema", "authorization"):
        _row(text, label)
    assert "with 2 effects" not in text, text
    # Both faults were injected, and the approval was decided through the store
    assert "SIGKILL worker" in text and "SIGSTOP worker" in text and "SIGCONT worker" in text, text
    assert "approved by" in text and "(store.approve)" in text, text
    # And one durable turn ran with a worker killed in the middle, its steps shown and checked
    assert "A durable turn (succeeded" in text, text
    assert "SIGKILL worker process" in text and "holding the turn" in text, text
    turn_checks = [line for line in text.splitlines() if "turn check:" in line]
    assert len(turn_checks) == 5 and all(": PASS (" in line for line in turn_checks), turn_checks
    assert "step 3: final" in text, text
    # Its first step worked out the credit's amount in the sandbox (bubblewrap is
    # installed by make test's dependency step, so the program ran: not refused)
    assert "one calculation ran sandboxed: PASS (sandbox.run_python printed '12500')" in text, text
    # It ran in a fresh directory under TOOLFENCE_HOME, and left no process behind
    runs = list(home.glob("demo-*"))
    assert len(runs) == 1 and (runs[0] / "toolfence.db").exists()
    # And `toolfence check` finds every invariant holding on the demo's database
    checked = subprocess.run(
        [sys.executable, "-m", "executor.cli", "check", "--all"], env=_demo_env(runs[0]),
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "all invariants hold" in checked.stdout and "the ledger's" in checked.stdout, checked.stdout
    leftovers = lambda: _processes_mentioning(str(tmp_path))  # noqa: E731
    assert _wait_for(lambda: not leftovers(), 10), leftovers()
    assert seconds < 120, f"the demo took {seconds:.0f} s"


def test_demo__run_twice__second_run_does_not_collide(tmp_path: Path) -> None:
    # Given a TOOLFENCE_HOME that already holds a demo run's directory and database
    home = tmp_path / "home"
    (home / "demo-20000101-000000-1").mkdir(parents=True)
    (home / "toolfence.db").write_bytes(b"not a database: the demo must not open it")
    output = tmp_path / "demo.out"
    # When the demo runs again with a tiny workload
    demo = _start_demo(home, output, "--calls", "12", "--workers", "1")
    returncode = demo.wait(timeout=240)
    text = output.read_text(errors="replace")
    # Then it used a directory of its own and left the other files alone
    assert returncode == 0, text
    assert len(list(home.glob("demo-*"))) == 2
    assert (home / "toolfence.db").read_bytes().startswith(b"not a database")


@pytest.mark.parametrize(
    ("sig", "when", "expected_status"),
    [
        (signal.SIGINT, "wave 1:", 130),  # Ctrl-C while the workload runs
        (signal.SIGTERM, None, 143),  # a supervisor stopping it while the fleet starts
    ],
    ids=["sigint-mid-run", "sigterm-during-startup"],
)
def test_demo__interrupted__stops_every_process_it_started_and_exits_non_zero(
    tmp_path: Path, sig: signal.Signals, when: str | None, expected_status: int
) -> None:
    # Given a demo whose fleet is running
    home = tmp_path / "home"
    output = tmp_path / "demo.out"
    demo = _start_demo(home, output, "--calls", "300")
    marker = str(tmp_path)
    try:
        assert _wait_for(lambda: len(_processes_mentioning(marker, exclude=demo.pid)) >= 1, 60), (
            output.read_text(errors="replace")
        )
        if when is not None:
            assert _wait_for(lambda: when in output.read_text(errors="replace"), 90), (
                output.read_text(errors="replace")
            )
            assert len(_processes_mentioning(marker, exclude=demo.pid)) >= 4  # relay, workers, reconciler
        # When it is interrupted
        demo.send_signal(sig)
        returncode = demo.wait(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    text = output.read_text(errors="replace")
    # Then it exits non-zero, cleanly, and no process it started is left alive
    assert returncode == expected_status, text
    assert "Traceback" not in text, text
    assert "interrupted: stopped the" in text, text
    assert _wait_for(lambda: not _processes_mentioning(marker), 10), _processes_mentioning(marker)


def test_demo__ctrl_c_again_while_it_exits__still_exits_130_without_a_traceback(tmp_path: Path) -> None:
    # Given a demo whose workload runs, interrupted once
    home = tmp_path / "home"
    output = tmp_path / "demo.out"
    demo = _start_demo(home, output, "--calls", "300")
    marker = str(tmp_path)
    try:
        assert _wait_for(lambda: "wave 1:" in output.read_text(errors="replace"), 90), (
            output.read_text(errors="replace")
        )
        demo.send_signal(signal.SIGINT)
        # When an impatient person presses Ctrl-C again and again after it said it stopped
        assert _wait_for(lambda: "interrupted: stopped the" in output.read_text(errors="replace"), 60), (
            output.read_text(errors="replace")
        )
        deadline = time.monotonic() + 30
        while demo.poll() is None and time.monotonic() < deadline:
            demo.send_signal(signal.SIGINT)
            time.sleep(0.002)
        returncode = demo.wait(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
    text = output.read_text(errors="replace")
    # Then the status is still the one for an interrupt, not a death by signal, and nothing is left
    assert returncode == 130, text
    assert "Traceback" not in text, text
    assert _wait_for(lambda: not _processes_mentioning(marker), 10), _processes_mentioning(marker)
