"""Hostile programs against the real bubblewrap sandbox of this machine: from the
runner (the tool's own path) and from `toolfence sandbox run --json`.

Each run gets a host uid of its own (TOOLFENCE_SANDBOX_HOST_UID; the suite runs as
root, as `make test` does), so "nothing left running" is exact: no process of
that uid, and none running the marker a program tried to leave behind, once the
run has returned. The worker's side is tests/fleet/test_fleet_sandbox.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.sandbox.command import Runtime
from executor.sandbox.limits import Limits, Program
from executor.sandbox.result import shape
from executor.sandbox.runner import execute
from tests.sandbox.hostile import (
    CANARY_ENV,
    CHECKOUT,
    HOSTILE,
    MARGIN_SECONDS,
    Host,
    Hostile,
    names_checkout,
    nothing_left,
)

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="a host uid per run needs root (make test runs as root)"
)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    placed = Host.create(tmp_path)
    monkeypatch.setenv(CANARY_ENV, placed.env_secret)
    yield placed


@pytest.fixture
def sandbox_uid(monkeypatch: pytest.MonkeyPatch) -> int:
    uid = 61_000 + uuid.uuid4().int % 4_000
    monkeypatch.setenv("TOOLFENCE_SANDBOX_HOST_UID", str(uid))
    return uid


def check_contained(hostile: Hostile, host: Host, uid: int, seen: dict[str, Any]) -> None:
    """The outcome, the lines expected, no secret anywhere, within the bound, nothing left."""
    shown = json.dumps(seen)
    assert seen["outcome"] == hostile.outcome, shown[:3000]
    assert seen["untrusted"] is True
    lines = seen["stdout"].splitlines()
    for line in hostile.expect:
        assert any(seen == line or seen.startswith(line + " ") for seen in lines), shown[:3000]
    for secret in host.secrets:
        leaked = names_checkout(shown) if secret == str(CHECKOUT) else secret in shown
        assert not leaked, f"{secret[:40]} reached the result"
    files = {f["name"]: f for f in seen["files"]}
    for name, kind in hostile.files.items():
        assert files[name]["kind"] == kind, files
        if kind == "symlink":  # never followed: no digest, no text of its target
            assert files[name]["sha256"] is None and files[name]["text"] is None
    assert seen["duration_ms"] <= (hostile.timeout + MARGIN_SECONDS) * 1000, seen["duration_ms"]
    assert nothing_left(uid, host.marker) == []


@ROOT_ONLY
@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda h: h.name)
def test_runner__hostile_program__contained_with_its_outcome(
    hostile: Hostile, host: Host, sandbox_uid: int
) -> None:
    # Given a hostile program and the limits a call would ask for
    limits = Limits(timeout_seconds=hostile.timeout, memory_mb=hostile.memory_mb)
    # When the tool's runner runs it in the sandbox
    result = shape(execute(Program(host.render(hostile.code)), limits, Runtime.from_settings()), limits)
    # Then it is contained, ends with its outcome, and leaves nothing running
    check_contained(hostile, host, sandbox_uid, result.model_dump(mode="json"))


def run_cli(*arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    return subprocess.run(
        [sys.executable, "-m", "executor.cli.main", "sandbox", *arguments],
        capture_output=True, text=True, env=env, input=stdin, timeout=120, cwd=CHECKOUT,
    )


@ROOT_ONLY
@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda h: h.name)
def test_cli__hostile_program__same_result_as_the_tool(
    hostile: Hostile, host: Host, sandbox_uid: int, tmp_path: Path
) -> None:
    # Given the program in a file
    program = tmp_path / "program.py"
    program.write_text(host.render(hostile.code), encoding="utf-8")
    # When an operator runs it with `toolfence sandbox run --json`
    completed = run_cli(
        "run", "--json", "--timeout", str(hostile.timeout), "--memory", str(hostile.memory_mb), str(program)
    )
    # Then it prints the tool's result: contained, with its outcome; exit 0 only for ok
    assert completed.returncode == (0 if hostile.outcome == "ok" else 1), completed.stderr
    check_contained(hostile, host, sandbox_uid, json.loads(completed.stdout))


def test_cli_check__this_machine__every_required_feature() -> None:
    completed = run_cli("check", "--json")
    report = json.loads(completed.stdout)
    assert completed.returncode == 0 and report["usable"] is True, report
    names = {f["name"]: f for f in report["features"]}
    for required in ("user namespace", "PID namespace", "network namespace", "mount namespace", "rlimits"):
        assert names[required]["available"] is True, names[required]
    assert names["cgroup v2 memory and pids"]["required"] is False


def test_cli_run__stdin_program__prints_outcome_and_output() -> None:
    completed = run_cli("run", "-", stdin="print(6 * 7)\n")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[:3] == [
        completed.stdout.splitlines()[0], "--- stdout (untrusted)", "42",
    ]
    assert completed.stdout.startswith("outcome: ok (exit 0) in ")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--timeout", "0"), "--timeout"),
        (("--timeout", "nan"), "--timeout"),
        (("--memory", "8"), "--memory"),
    ],
)
def test_cli_run__bad_limit__usage_error_and_nothing_run(
    arguments: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    witness = tmp_path / "ran"
    program = tmp_path / "program.py"
    program.write_text(f"open({str(witness)!r}, 'w')\n", encoding="utf-8")
    completed = run_cli("run", *arguments, str(program))
    assert completed.returncode == 2, completed
    assert completed.stderr.startswith("toolfence: ") or message in completed.stderr, completed.stderr
    assert message in completed.stderr
    assert not witness.exists()


def test_cli_run__not_a_regular_file__usage_error(tmp_path: Path) -> None:
    completed = run_cli("run", str(tmp_path))
    assert completed.returncode == 2 and "not a regular file" in completed.stderr, completed.stderr


def test_cli__no_bubblewrap__check_says_what_is_missing_and_run_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLFENCE_SANDBOX_BWRAP", "/nonexistent/bwrap")
    checked = run_cli("check")
    assert checked.returncode == 1
    assert "MISSING bubblewrap and interpreter: bubblewrap not found" in checked.stdout, checked.stdout
    assert checked.stdout.rstrip().endswith("NOT usable: sandbox.run_python refuses (sandbox_unavailable)")
    witness = tmp_path / "ran-unsandboxed"
    program = tmp_path / "program.py"
    program.write_text(f"open({str(witness)!r}, 'w')\n", encoding="utf-8")
    ran = run_cli("run", str(program))
    assert ran.returncode == 1 and "sandbox unavailable: bubblewrap not found" in ran.stderr, ran.stderr
    assert ran.stdout == "" and not witness.exists()
