"""The commands the demo's report prints for a person to look around with, spelt
so that they work when pasted into a shell: `toolfence` as this process was
started (the virtualenv's script by its path when it is not on PATH, or
`python -m executor.cli`), and the run's own home and database named, whatever
the shell's environment or a settings file says."""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path


def toolfence_command(argv0: str | None = None, executable: str | None = None) -> list[str]:
    """The words that run this `toolfence`: `toolfence` when that name on PATH is this
    very script, else the script's absolute path; started as `python -m executor.cli`
    (argv[0] is then the module's file), that interpreter with `-m executor.cli`."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    script = Path(argv0)
    if script.name == "toolfence" and script.is_file():
        found = shutil.which("toolfence")
        if found is not None and Path(found).resolve() == script.resolve():
            return ["toolfence"]
        return [str(script.resolve())]
    return [executable or sys.executable, "-m", "executor.cli"]


def look_around(
    run_dir: Path, database_url: str, *commands: Sequence[str], toolfence: Sequence[str] | None = None
) -> list[str]:
    """One shell line per command, each naming the run's home and database (the
    environment wins over a settings file, so a configured one cannot redirect it)."""
    # Only the values are quoted: a quoted `'NAME=value'` is a command, not an assignment.
    prefix = f"TOOLFENCE_HOME={shlex.quote(str(run_dir))} TOOLFENCE_DATABASE_URL={shlex.quote(database_url)}"
    words = list(toolfence) if toolfence is not None else toolfence_command()
    return [f"{prefix} {shlex.join([*words, *command])}" for command in commands]


__all__ = ["look_around", "toolfence_command"]

