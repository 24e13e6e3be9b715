"""`toolfence eval`: run labelled cases as durable turns on a real fleet and score the
model and the executor apart (docs/eval.md). Also `toolfence eval compare A B` (two
JSON reports, regression by category as a failure ratio) and `toolfence eval
import-bfcl` (BFCL's data into fixtures)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor.cli.args import UserError

if TYPE_CHECKING:
    from executor.cli.fleet import Fleet
    from executor.eval.fixtures import Fixtures

def print_json(value: Any) -> None:
    from executor.cli.common import print_json as printed

    printed(value)


def settings() -> Any:
    from executor.cli.common import settings as chosen

    return chosen()


HELP = "Score a model and the executor apart: labelled cases as durable turns on a real fleet."
FLEET_PIDS = "fleet.pids"


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "eval", help=HELP,
        description=HELP + " `toolfence eval compare BASELINE.json CANDIDATE.json` compares two runs; "
        "`toolfence eval import-bfcl OUT.jsonl [--data DIR]` imports BFCL.",
        usage="toolfence eval FIXTURES --driver D [options] | eval compare A B | eval import-bfcl OUT",
    )
    parser.set_defaults(func=run)
    parser.add_argument("fixtures", help="the fixtures file (JSONL), or `compare`, or `import-bfcl`")
    parser.add_argument("more", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument(
        "--driver", help="recorded:FILE, perturb[:KIND,...], or any turn driver (openai-chat:MODEL, ...)"
    )
    parser.add_argument(
        "--parallel", type=int, default=4, help="cases run at once (and the fleet's worker slots)"
    )
    parser.add_argument("--run-dir", help="the run's directory; run again with the same one to resume")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for CI)")
    parser.add_argument("--report", help="also write the report: FILE.json, FILE.html or FILE.md")
    parser.add_argument(
        "--fleet", choices=("embedded", "configured"), default="embedded",
        help="embedded: the run's own SQLite database, filesystem broker and fleet, started here; "
        "configured: TOOLFENCE_DATABASE_URL and your running fleet (whose TOOLFENCE_TOOLS must be the "
        "fixtures' registry)",
    )
    parser.add_argument("--case-timeout", type=float, default=300.0, help="seconds a case may take")
    parser.add_argument("--max-steps", type=int, default=8, help="model steps per turn")
    parser.add_argument("--threshold", type=float, default=2.0,
                        help="compare: a failure ratio at or above this is a regression (exit 1)")
    parser.add_argument(
        "--data", help="import-bfcl: BFCL's data directory (default: the installed bfcl-eval)"
    )
    parser.add_argument(
        "--categories", default="", help="import-bfcl: comma-separated (default: all single-turn)"
    )
    parser.add_argument("--sample", type=int, default=None, help="import-bfcl: cases per category (seeded)")
    parser.add_argument("--recording", help="import-bfcl: also write BFCL's ground truth as a recording "
                        "(OpenAI chat completions) for --driver recorded:FILE")


def run(args: argparse.Namespace) -> int:
    from executor.eval.fixtures import FixtureError

    try:
        if args.fixtures == "compare":
            return _compare(args)
        if args.fixtures == "import-bfcl":
            return _import_bfcl(args)
        if args.more:
            raise UserError(f"unexpected arguments {' '.join(args.more)!r}")
        return _run_eval(args)
    except FixtureError as exc:
        raise UserError(str(exc)) from None


def _compare(args: argparse.Namespace) -> int:
    from executor.eval.report import compare, comparison_text, load_report, regressions

    if len(args.more) != 2:
        raise UserError("toolfence eval compare BASELINE.json CANDIDATE.json")
    baseline, candidate = (load_report(Path(p)) for p in args.more)
    comparison = compare(baseline, candidate)
    found = regressions(comparison, args.threshold)
    if args.json:
        print_json({**comparison, "threshold": args.threshold, "regressions": found})
    else:
        print(comparison_text(comparison, args.threshold))
    return 1 if found else 0


def _import_bfcl(args: argparse.Namespace) -> int:
    from executor.eval.bfcl import (
        CATEGORIES,
        data_dir_of_package,
        ground_truth_recording,
        import_bfcl,
        write_fixtures,
    )

    if len(args.more) != 1:
        raise UserError("toolfence eval import-bfcl OUT.jsonl [--data DIR] [--categories ...] [--sample N]")
    if args.data:
        data_dir, version = Path(args.data), _version_beside(Path(args.data))
    else:
        data_dir, version = data_dir_of_package()
    categories = [c for c in args.categories.split(",") if c] or list(CATEGORIES)
    lines = import_bfcl(data_dir, version, categories, sample=args.sample)
    write_fixtures(lines, Path(args.more[0]))
    if args.recording:
        write_fixtures(ground_truth_recording(lines), Path(args.recording))
    print(f"{len(lines) - 1} case(s) from bfcl-eval {version or '(version unknown)'} → {args.more[0]}")
    return 0


def _version_beside(data_dir: Path) -> str:
    """The version of an unpacked wheel's data: its dist-info's METADATA."""
    for metadata in data_dir.parent.parent.glob("bfcl_eval-*.dist-info/METADATA"):
        for line in metadata.read_text(encoding="utf-8").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return ""


def _embedded_env(run_dir: Path, token: str, fixtures: Fixtures) -> dict[str, str]:
    return {
        "TOOLFENCE_HOME": str(run_dir),
        "TOOLFENCE_DATABASE_URL": f"sqlite:///{run_dir / 'toolfence.db'}",
        "TOOLFENCE_BROKER_URL": f"filesystem://{run_dir / 'broker'}",
        "TOOLFENCE_QUEUE": f"toolfence-eval-{token}",
        "TOOLFENCE_TOOLS": fixtures.header.tools,
        "TOOLFENCE_EVAL_FIXTURES": str(fixtures.path),
        "TOOLFENCE_TURN_SCOPE": "conversation",
        "TOOLFENCE_RELAY_POLL_SECONDS": "0.05",
        "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": "5",
        "TOOLFENCE_TURN_WAIT_SECONDS": "2",
        # A turn whose holder died with a killed run is given back this soon after.
        "TOOLFENCE_LEASE_SECONDS": "5",
        "PROMETHEUS_MULTIPROC_DIR": str(run_dir / "metrics"),
    }


def _stop_stale_fleet(run_dir: Path) -> None:
    """A fleet an earlier, killed, eval process of this run started: its process groups,
    by the ids it recorded, when they are still toolfence processes."""
    pids_file = run_dir / FLEET_PIDS
    if not pids_file.exists():
        return
    for text in pids_file.read_text(encoding="utf-8").split():
        pid = int(text)
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"executor.cli" in command:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    pids_file.unlink()


def _start_fleet(run_dir: Path, env: Mapping[str, str], parallel: int) -> Fleet:
    from executor.cli.fleet import Fleet

    _stop_stale_fleet(run_dir)
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    fleet = Fleet(env=dict(env), log_dir=run_dir / "fleet", workers=1, concurrency=parallel,
                  reconcile_every=1.0)
    try:
        # Recorded as soon as they exist: a run killed while its fleet starts leaves none
        # that a resumed run cannot find.
        fleet.start_relay(0)
        fleet.start_worker(0)
        fleet.start_reconciler()
        (run_dir / FLEET_PIDS).write_text(" ".join(str(m.pid) for m in fleet.members), encoding="utf-8")
        fleet.wait_ready(60.0)
    except RuntimeError as exc:  # a member exited or never said it was ready
        fleet.stop()
        (run_dir / FLEET_PIDS).unlink(missing_ok=True)
        raise UserError(f"the eval fleet did not start: {exc}") from None
    return fleet


def _run_eval(args: argparse.Namespace) -> int:
    from executor.eval.fixtures import load_fixtures
    from executor.eval.runner import Manifest

    if not args.driver:
        raise UserError(
            "say what answers for the model: --driver recorded:FILE, perturb, openai-chat:MODEL, ..."
        )
    if not 1 <= args.parallel <= 64:
        raise UserError("--parallel is 1..64")
    fixtures = load_fixtures(args.fixtures)
    driver = args.driver
    if driver.startswith("recorded:"):
        driver = f"recorded:{Path(driver.partition(':')[2]).resolve()}"
    chosen = settings()
    run_dir = Path(args.run_dir or Path(chosen.home) / f"eval-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    manifest = Manifest.open(run_dir, fixtures, driver)
    if args.fleet == "embedded":
        env = _embedded_env(run_dir, manifest.token, fixtures)
    else:
        env = {"TOOLFENCE_EVAL_FIXTURES": str(fixtures.path)}
        if chosen.tools_module != fixtures.header.tools:
            print(f"warning: TOOLFENCE_TOOLS is {chosen.tools_module or 'unset'}, the fixtures name "
                  f"{fixtures.header.tools}: your workers must load the latter", file=sys.stderr)
    from executor.cli.fleet import fleet_environment

    with fleet_environment(env):
        report = _execute(args, fixtures, driver, run_dir, manifest)
    text = json.dumps(report, indent=1, sort_keys=True) + "\n"
    (run_dir / "report.json").write_text(text, encoding="utf-8")
    if args.report:
        from executor.eval.report import write_report

        write_report(report, Path(args.report))
    if args.json:
        print_json(report)
    else:
        from executor.eval.report import markdown

        print(markdown(report), end="")
    return 0


def _execute(
    args: argparse.Namespace, fixtures: Fixtures, driver: str, run_dir: Path, manifest: Any
) -> dict[str, Any]:
    from executor.core.tools import load_registry
    from executor.eval.downstream import load_downstream
    from executor.eval.drivers import plan_cases
    from executor.eval.report import build_report
    from executor.eval.runner import Runner, check_cases, observe
    from executor.eval.scoring import score_case
    from executor.settings import Settings
    from executor.store.engine import make_engine
    from executor.store.migrate import migrate

    current = Settings.from_env()
    database_url = current.database_url
    migrate(database_url)
    registry = load_registry(fixtures.header.tools)
    check_cases(fixtures.cases, registry)
    downstream = load_downstream(fixtures.header.downstream)
    downstream.prepare(database_url, fixtures.cases)
    plans = plan_cases(fixtures, driver, run_dir, registry=registry, downstream=downstream)
    engine = make_engine(database_url)
    fleet = _start_fleet(run_dir, os.environ, args.parallel) if args.fleet == "embedded" else None
    try:
        Runner(
            plans, manifest, engine, registry, parallel=args.parallel, case_timeout=args.case_timeout,
            max_steps=args.max_steps, on_progress=lambda line: print(line, file=sys.stderr, flush=True),
        ).run()
    finally:
        if fleet is not None:
            fleet.stop()
            (run_dir / FLEET_PIDS).unlink(missing_ok=True)
    observations = observe(plans, manifest, engine, database_url, downstream)
    known = frozenset(registry.names())
    engine.dispose()
    scores = [
        score_case(plan.case, observation, known)
        for plan, observation in zip(plans, observations, strict=True)
    ]
    return build_report(fixtures, driver, run_dir, scores)
