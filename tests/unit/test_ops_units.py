"""ops/cron and ops/systemd: the reconciler sweep every minute, with the env file."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_FILE = "/etc/toolfence/toolfence.env"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((ROOT / "ops" / "systemd" / name).read_text(encoding="utf-8"))
    return parser


def test_cron__one_line_runs_reconcile_every_minute_with_the_env_file() -> None:
    text = (ROOT / "ops" / "cron" / "toolfence-reconcile.cron").read_text(encoding="utf-8")
    jobs = [
        line for line in text.splitlines()
        if line.strip() and not line.startswith("#") and "=" not in line.split()[0]
    ]

    assert len(jobs) == 1
    fields = shlex.split(jobs[0])
    # /etc/cron.d format: five time fields, then the user.
    assert fields[:6] == ["*", "*", "*", "*", "*", "toolfence"]
    command = " ".join(fields[6:])
    assert f". {ENV_FILE}" in command
    assert "toolfence reconcile" in command
    assert text.endswith("\n")  # cron ignores a last line without a newline


def test_systemd__oneshot_service_runs_reconcile_with_the_env_file() -> None:
    service = unit("toolfence-reconcile.service")["Service"]

    assert service["Type"] == "oneshot"
    assert service["EnvironmentFile"] == ENV_FILE
    assert service["ExecStart"].endswith("/toolfence reconcile")
    assert int(service["TimeoutStartSec"]) > 0


def test_systemd__timer_starts_the_service_every_minute() -> None:
    timer = unit("toolfence-reconcile.timer")

    assert timer["Timer"]["OnCalendar"] == "minutely"
    assert timer["Timer"]["Unit"] == "toolfence-reconcile.service"
    assert timer["Install"]["WantedBy"] == "timers.target"
