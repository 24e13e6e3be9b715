"""The real CLI, as a subprocess, on hostile command-line values: each is refused
with one `toolfence: ...` line on stderr and exit status 2, at once: never a spin,
a block, an `internal error`, or a database's raw message."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each refusal must come at once; the old CLI spun (reconcile) or blocked (a FIFO)
# until this ran out.
TIMEOUT_SECONDS = 30


def _toolfence(home: Path, *args: str, database_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    env["TOOLFENCE_HOME"] = str(home)
    env["TOOLFENCE_TOOLS"] = "ledger.tools:registry"
    if database_url is not None:
        env["TOOLFENCE_DATABASE_URL"] = database_url
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    # A lone surrogate in argv reaches the child as itself (surrogateescape both ways).
    return subprocess.run(
        [sys.executable, "-m", "executor.cli.main", *args], env=env, capture_output=True, text=True,
        errors="surrogateescape", timeout=TIMEOUT_SECONDS, cwd=home,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("cli-args")
    migrated = _toolfence(home, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    return home


def _assert_refused(run: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr[:2000])
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr[:2000]
    assert lines[0].startswith("toolfence: ") and fragment in lines[0], lines[0]
    assert "internal error" not in lines[0] and "Traceback" not in run.stderr


KEY = ["keys", "create", "--scope", "read"]
HOSTILE_ARGS = [
    pytest.param(["reconcile", "--every", "-1"], "--every", id="reconcile_every_negative"),
    pytest.param(["reconcile", "--every", "nan"], "--every", id="reconcile_every_nan"),
    pytest.param(["reconcile", "--every", "inf"], "--every", id="reconcile_every_inf"),
    pytest.param(["results", "req-1", "--tenant", "acme", "--wait", "-5"], "--wait",
                 id="results_wait_negative"),
    pytest.param(["metrics", "--port", "99999"], "--port", id="metrics_port_99999"),
    pytest.param(["metrics", "--port", "-1"], "--port", id="metrics_port_negative"),
    pytest.param(["serve", "--port", "70000"], "--port", id="serve_port_70000"),
    pytest.param(["pending", "--limit", "0"], "--limit", id="pending_limit_zero"),
    pytest.param([*KEY, "--tenant", "acme\nforged: line", "--principal", "alice"], "--tenant",
                 id="keys_tenant_newline"),
    pytest.param([*KEY, "--tenant", "acme", "--principal", "alice", "--role", "member,\udcff"], "--role",
                 id="keys_role_lone_surrogate"),
    pytest.param([*KEY, "--tenant", "acme", "--principal", "a\x1b[2Jb"], "--principal",
                 id="keys_principal_escape"),
    pytest.param([*KEY, "--tenant", "acme", "--principal", "p" * 300], "--principal",
                 id="keys_principal_300_chars"),
    pytest.param([*KEY, "--tenant", "acme", "--principal", "alice", "--label", "l" * 201], "label",
                 id="keys_label_201_chars"),
]


@pytest.mark.parametrize(("args", "fragment"), HOSTILE_ARGS)
def test_cli__hostile_argument__one_line_and_exit_2(home: Path, args: list[str], fragment: str) -> None:
    # Given a value the command cannot take; when the real CLI runs with it
    started = time.monotonic()
    run = _toolfence(home, *args)
    # Then it is refused at once, in one line naming the flag, with exit status 2
    _assert_refused(run, fragment)
    assert time.monotonic() - started < TIMEOUT_SECONDS
    # And the value itself (a forged line, an escape) is not echoed
    assert "forged" not in run.stderr and "\x1b" not in run.stderr and "p" * 300 not in run.stderr


@pytest.mark.postgres
def test_cli_keys_create__300_character_principal_on_postgresql__one_line_not_the_database_error(
    pg_url: str, tmp_path: Path
) -> None:
    # Given PostgreSQL, whose String(200) column refused it with a raw DataError
    run = _toolfence(tmp_path, *KEY, "--tenant", "acme", "--principal", "p" * 300, database_url=pg_url)
    # Then the CLI answers in its own words, before the insert
    _assert_refused(run, "--principal: principal is not a valid identifier (too_long)")
    assert "character varying" not in run.stderr
    listed = _toolfence(tmp_path, "keys", "list", database_url=pg_url)
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_cli_enqueue__not_a_regular_file__refused_without_reading(home: Path, kind: str) -> None:
    # Given a path that is not a regular file: a FIFO nobody writes to (opening it
    # for reading used to wait for a writer forever), a directory, a device
    path = {"fifo": home / "calls.fifo", "directory": home / "calls.d", "device": Path("/dev/zero")}[kind]
    if kind == "fifo" and not path.exists():
        os.mkfifo(path)
    if kind == "directory":
        path.mkdir(exist_ok=True)
    started = time.monotonic()
    # When the real CLI is asked to enqueue it
    run = _toolfence(home, "enqueue", str(path), "--tenant", "acme", "--principal", "alice")
    # Then it says so at once, in one line, exit status 2
    _assert_refused(run, "is not a regular file")
    assert time.monotonic() - started < TIMEOUT_SECONDS


def test_cli_metrics__default_host__listens_on_loopback_only(home: Path) -> None:
    # Given the exporter started with no --host (and a free port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    env.update(
        TOOLFENCE_HOME=str(home), TOOLFENCE_METRICS_PORT="0",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "executor.cli.main", "-v", "metrics", "--database-only"], env=env, cwd=home,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        # When it says where it serves
        assert process.stderr is not None
        deadline = time.monotonic() + TIMEOUT_SECONDS
        line = ""
        while time.monotonic() < deadline and "serving metrics on" not in line:
            line = process.stderr.readline()
        # Then that is the loopback address
        assert "serving metrics on http://127.0.0.1:" in line, line
    finally:
        process.terminate()
        process.wait(timeout=TIMEOUT_SECONDS)
