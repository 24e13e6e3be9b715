"""The demo's "look around" commands work as printed: pasted into a shell that has
neither the virtualenv on PATH nor the run's settings, they read the run's database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from executor.cli.demo.hints import look_around, toolfence_command

ROOT = Path(__file__).resolve().parents[2]


def test_toolfence_command__script_not_on_path__its_absolute_path(tmp_path: Path) -> None:
    script = tmp_path / "venv" / "bin" / "toolfence"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    assert toolfence_command(str(script)) == [str(script)]


def test_toolfence_command__run_as_a_module__the_interpreter_with_dash_m() -> None:
    assert toolfence_command("/x/executor/cli/__main__.py", "/venv/bin/python") == [
        "/venv/bin/python", "-m", "executor.cli",
    ]


@pytest.mark.parametrize("how", ["script", "module"])
def test_look_around__pasted_into_a_bare_shell__lists_the_runs_pending_operations(
    how: str, sqlite_url: str, tmp_path: Path,
) -> None:
    # Given a run directory (with a space in its path) holding a migrated database, and a
    # shell whose PATH has no virtualenv and whose environment names another database
    run_dir = tmp_path / "demo run"
    run_dir.mkdir()
    database = run_dir / "toolfence.db"
    os.replace(sqlite_url.removeprefix("sqlite:///"), database)
    script = Path(sys.executable).parent / "toolfence"
    words = [str(script)] if how == "script" else [sys.executable, "-m", "executor.cli"]
    [line] = look_around(run_dir, f"sqlite:///{database}", ["pending"], toolfence=words)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
           "TOOLFENCE_DATABASE_URL": f"sqlite:///{tmp_path / 'elsewhere.db'}"}
    # When the printed line is run by a shell
    run = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=120)
    # Then it answers from the run's database
    assert run.returncode == 0, (line, run.stderr)
    assert json.loads(run.stdout) == []
