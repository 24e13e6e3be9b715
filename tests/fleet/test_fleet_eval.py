"""`toolfence eval` for real: the command as a user runs it (a subprocess, its own
TOOLFENCE_HOME), on the embedded default it starts itself (SQLite, the filesystem
broker, a relay, a worker and a reconciler), with the recorded and perturbing
drivers, over the ledger's fixtures and a BFCL sample; an eval process SIGKILLed
mid-run and run again in the same run directory; and a run on the user's own
fleet (PostgreSQL, Redis) with `--fleet configured`.

Side effects are checked from the downstream's own tables (the ledger's
`ledger_effects`, the recording handlers' `eval_tool_records`), not from the
report alone.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from ledger.service import Ledger, effects

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "ledger" / "eval" / "ledger.jsonl"
LEDGER_RECORDED = ROOT / "ledger" / "eval" / "ledger.recorded.jsonl"
BFCL = ROOT / "tests" / "fixtures" / "eval" / "bfcl_sample.jsonl"
BFCL_RECORDED = ROOT / "tests" / "fixtures" / "eval" / "bfcl_sample.recorded.jsonl"
FIGURES = ("tool_selection", "argument_validation", "violation_catch", "side_effects", "final_answer")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFENCE_", "PROMETHEUS_"))}
    env["TOOLFENCE_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def _command(fixtures: Path, driver: str, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "executor.cli", "eval", str(fixtures), "--driver", driver,
            "--run-dir", str(run_dir), *extra]


def run_eval(home: Path, fixtures: Path, driver: str, run_dir: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run(_command(fixtures, driver, run_dir, "--json", *extra), env=_env(home), cwd=ROOT,
                          capture_output=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.fixture
def run_dirs(tmp_path: Path) -> Iterator[list[Path]]:
    """Run directories whose fleets are stopped at the end whatever happened: by the
    process group ids each recorded, only while they are toolfence processes."""
    dirs: list[Path] = []
    yield dirs
    for run_dir in dirs:
        pids = run_dir / "fleet.pids"
        if not pids.exists():
            continue
        for text in pids.read_text().split():
            try:
                if b"executor.cli" in Path(f"/proc/{text}/cmdline").read_bytes():
                    os.killpg(int(text), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def ledger_effects(run_dir: Path) -> dict[str, int]:
    with sqlite3.connect(run_dir / "toolfence.db") as db:
        return dict(db.execute("SELECT kind, count(*) FROM ledger_effects GROUP BY kind").fetchall())


def rates(report: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {name: (f["passed"], f["total"]) for name, f in report["figures"].items()}


def test_eval__bfcl_sample_recorded_and_perturbed__compare_flags_the_model_half_only(
    tmp_path: Path, run_dirs: list[Path]
) -> None:
    recorded_dir, perturbed_dir = tmp_path / "recorded", tmp_path / "perturbed"
    run_dirs.extend([recorded_dir, perturbed_dir])
    # BFCL's ground truth replayed as OpenAI chat completions: every figure measured is whole
    recorded = run_eval(tmp_path / "home", BFCL, f"recorded:{BFCL_RECORDED}", recorded_dir,
                        "--parallel", "4", "--report", str(tmp_path / "recorded.json"))
    cases = recorded["cases"]
    assert recorded["cases_passed"] == cases
    assert rates(recorded)["tool_selection"] == (cases, cases)
    # The same ground truth, perturbed: the model half fails by construction, and the
    # executor catches every perturbed call and lets only the others take effect
    perturbed = run_eval(tmp_path / "home", BFCL, "perturb", perturbed_dir,
                         "--parallel", "4", "--report", str(tmp_path / "perturbed.json"))
    assert rates(perturbed)["tool_selection"] == (0, cases)
    assert rates(perturbed)["violation_catch"] == (cases, cases)
    assert rates(perturbed)["side_effects"] == (cases, cases)
    kinds = {r["perturbation"] for r in perturbed["results"]}
    assert kinds == {"wrong_tool", "missing_arg", "extra_field", "other_tenant", "repetition"}
    assert len(perturbed["failures"]) == cases  # each listed, with why
    # Side effects from the recording handlers' own table: a repeated write recorded once
    with sqlite3.connect(perturbed_dir / "toolfence.db") as db:
        query = "SELECT operation_id, count(*) FROM eval_tool_records GROUP BY 1"
        per_operation = db.execute(query).fetchall()
    assert per_operation and all(count == 1 for _, count in per_operation)
    # Compared with the recorded run: a regression of the model half, none of the executor's
    done = subprocess.run(
        [sys.executable, "-m", "executor.cli", "eval", "compare", str(tmp_path / "recorded.json"),
         str(tmp_path / "perturbed.json"), "--json"],
        env=_env(tmp_path / "home"), cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert done.returncode == 1
    comparison = json.loads(done.stdout)
    regressed = {(r["category"], r["figure"]) for r in comparison["regressions"]}
    assert ("all", "tool_selection") in regressed
    assert not {figure for _, figure in regressed} & {"violation_catch", "side_effects"}


def _manifest(run_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {"cases": {}}
    return data


def _asked(run_dir: Path) -> dict[str, int]:
    """Model calls per script, from the scripted driver's own call logs."""
    return {path.name: len(path.read_text().splitlines()) for path in (run_dir / "scripts").glob("*.calls")}


def test_eval__sigkilled_mid_run__resumes_without_running_a_finished_case_again(
    tmp_path: Path, run_dirs: list[Path]
) -> None:
    run_dir = tmp_path / "run"
    run_dirs.append(run_dir)
    home = tmp_path / "home"
    # Given an eval running one case at a time
    with (tmp_path / "first.log").open("wb") as log:
        command = _command(LEDGER, f"recorded:{LEDGER_RECORDED}", run_dir, "--parallel", "1")
        process = subprocess.Popen(command, env=_env(home), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    finished: list[str] = []
    while time.monotonic() < deadline and process.poll() is None:
        finished = [c for c, e in _manifest(run_dir)["cases"].items() if e.get("done")]
        if len(finished) >= 2:
            break
        time.sleep(0.02)
    # When it is SIGKILLed once two cases finished (its fleet is left behind, orphaned)
    process.kill()
    process.wait(10)
    before = _manifest(run_dir)
    finished = [c for c, e in before["cases"].items() if e.get("done")]
    assert 2 <= len(finished) < 6, (tmp_path / "first.log").read_text()[-2000:]
    asked_before = _asked(run_dir)
    # And it is run again with the same run directory
    report = run_eval(home, LEDGER, f"recorded:{LEDGER_RECORDED}", run_dir, "--parallel", "1",
                      "--report", str(tmp_path / "report.md"))
    # Then every case is reported, the five figures apart: the recorded model proposed a
    # tool that does not exist (model half: wrong), which the executor refused (executor
    # half: right); everything else was right
    assert report["cases"] == 6
    assert set(report["figures"]) == set(FIGURES)
    assert rates(report) == {
        "tool_selection": (5, 6), "argument_validation": (8, 8), "violation_catch": (3, 3),
        "side_effects": (6, 6), "final_answer": (5, 5)}
    [failure] = report["failures"]
    assert failure["case"] == "nonexistent-tool"
    assert failure["reasons"] == [{"figure": "tool_selection",
                                   "why": "expected no call, got ledger.refund(account_id)"}]
    tenancy = report["categories"]["tenancy"]["figures"]
    assert tenancy["violation_catch"] == {"passed": 1, "total": 1, "rate": 1.0}
    markdown = (tmp_path / "report.md").read_text()
    assert "| policy violation catch rate | 100.0 % (3/3) |" in markdown
    assert "- `nonexistent-tool` (unknown_tool)" in markdown
    assert not (run_dir / "fleet.pids").exists()  # the command stopped its fleet
    after = _manifest(run_dir)
    assert after["token"] == before["token"]
    for case_id in finished:
        # the finished cases kept their turns, and their model was not asked again
        assert after["cases"][case_id]["turns"] == before["cases"][case_id]["turns"]
    asked_after = _asked(run_dir)
    finished_prefixes = [
        f"case{index:04d}-" for index, case_id in enumerate(_case_ids()) if case_id in finished
    ]
    finished_scripts = {name for name in asked_before if name.startswith(tuple(finished_prefixes))}
    assert finished_scripts
    assert {name: asked_after[name] for name in finished_scripts} == {
        name: asked_before[name] for name in finished_scripts}
    # And the ledger's own records show each effect once, across both processes: the
    # timed-out payment once, the credit and the dependent transfer once each, the other
    # tenant's credit and the 50 deletions (waiting for an approver) never
    assert ledger_effects(run_dir) == {"credit": 1, "transfer": 2}
    with sqlite3.connect(run_dir / "toolfence.db") as db:
        assert db.execute("SELECT remaining FROM ledger_eval_late_answers").fetchall() == [(0,)]
        left = db.execute("SELECT count(*) FROM ledger_invoices WHERE invoice_id LIKE 'inv-bd-%'").fetchone()
        assert left == (50,)


def _case_ids() -> list[str]:
    return [json.loads(line)["id"] for line in LEDGER.read_text().splitlines()[1:] if line.strip()]


def test_eval__configured_database_and_broker__runs_on_the_users_fleet(
    fleet_env: dict[str, str], make_fleet: Any, tmp_path: Path
) -> None:
    # Given the user's own fleet on PostgreSQL and Redis, loading the fixtures' registry
    tools = {"TOOLFENCE_TOOLS": "ledger.eval:registry"}
    make_fleet(workers=1, concurrency=3, relays=1, reconcile_every=0.5, env=tools).start()
    env = {**_env(tmp_path / "home"), **fleet_env, **tools}
    env["PYTHONPATH"] = _env(tmp_path / "home")["PYTHONPATH"]
    # When the eval runs against the configured database and broker, starting no fleet
    done = subprocess.run(
        _command(LEDGER, f"recorded:{LEDGER_RECORDED}", tmp_path / "run", "--fleet", "configured", "--json",
                 "--parallel", "3"),
        env=env, cwd=ROOT, capture_output=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads(done.stdout)
    # Then the figures are those of the embedded run, and the ledger's own tables agree
    assert rates(report) == {
        "tool_selection": (5, 6), "argument_validation": (8, 8), "violation_catch": (3, 3),
        "side_effects": (6, 6), "final_answer": (5, 5)}
    assert not (tmp_path / "run" / "fleet.pids").exists() and not (tmp_path / "run" / "toolfence.db").exists()
    book = Ledger(fleet_env["TOOLFENCE_DATABASE_URL"])
    try:
        with book.reader.connect() as conn:
            kinds = dict(conn.execute(select(effects.c.kind, func.count()).group_by(effects.c.kind)).all())
    finally:
        book.engine.dispose()
    assert kinds == {"credit": 1, "transfer": 2}
