"""`toolfence demo`: a real fleet, a realistic workload, two injected faults, and proof.

What it does, in order:

1. Picks a fresh place to run, so reruns never collide: a directory
   `$TOOLFENCE_HOME/demo-<timestamp>-<pid>` for logs (and, on the embedded
   default, the SQLite file and the filesystem broker). With a PostgreSQL
   `TOOLFENCE_DATABASE_URL` it creates a throwaway database next to the one
   named (`<name>_demo_<timestamp>_<pid>`) and drops it at the end: the demo never
   touches an existing database's tables. With a Redis or RabbitMQ
   `TOOLFENCE_BROKER_URL` it uses a queue of its own and deletes it at the end.
2. Migrates, creates the reference ledger and accounts for two tenants, starts
   a relay, the workers and the reconciler (`reconcile --every 1`) as real
   subprocesses (`executor.cli.fleet`).
3. Enqueues the workload in three waves (the second arriving as the fleet keeps
   up), one producer transaction per request:
   parallel reads, ordered writes on every effect contract, two transfers that
   need approval (one approved, one denied, through `executor.store`), and the
   mistakes a model makes that the admission gates refuse.
4. SIGKILLs one worker while it is inside a downstream call (an `unsafe` write
   if it can catch one), starts a replacement, then SIGSTOPs another while it is
   inside a fenced write, keeps it stopped until a new generation has taken the
   operation over and finished it, and SIGCONTs it: the ledger's fence refuses
   the stale write.
5. Once quiet, checks invariants I1–I7 (docs/design.md §Invariants) from the database and the
   ledger's own records.
6. Runs one scripted multi-step durable turn and SIGKILLs the worker holding it
   right after its step 2 checkpoint (`executor/cli/demo/turn.py`); the turn is
   taken over and finishes, and its steps are shown with their checks. Exit
   status 1 if any invariant or turn check fails.

Every process it started is stopped on the way out, also on Ctrl-C and SIGTERM.
"""


from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from executor.cli.demo.choreography import DemoRun
from executor.cli.demo.console import DemoConsole, demo_console
from executor.cli.demo.constants import (
    EXIT_INTERRUPTED,
    EXIT_INVARIANT_FAILED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    REQUEUE_QUEUED_AFTER_SECONDS,
    SETTLE_TIMEOUT_SECONDS,
    STOP,
    DemoError,
    _Terminated,
)
from executor.cli.demo.place import Place, prepare_place, teardown_place
from executor.cli.demo.report import _n, gather, model_view, render
from executor.cli.demo.turn import run_turn
from executor.cli.demo.workload import DemoRequest, build_workload, split_waves
from executor.cli.fleet import fleet_environment
from executor.settings import current

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt, SIGTERM `_Terminated`, in the main thread.

    The first one decides: its handler ignores both signals, then records the
    stop in `STOP` (raised at once only inside `pause()`, see `StopRequest`), so
    the cleanup it starts runs under SIG_IGN with no window for a second Ctrl-C,
    and they stay ignored until the process has exited. A handler set from Python
    is reset to SIG_DFL when the interpreter finalizes (SIG_IGN is kept), so a
    repeated Ctrl-C while the demo exits would otherwise turn status 130 into a
    death by SIGINT.
    """
    STOP.signum, STOP.received = None, False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        STOP.request(signum, frame)

    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        if not STOP.received:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """Cleanup must finish: a Ctrl-C during it must not leave processes behind."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _error_console() -> Console:
    return Console(stderr=True, soft_wrap=True)


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=160, no_color=True)


def run_demo(
    calls: int = 300, workers: int = 2, lease_seconds: float = 3.0, serve_port: int | None = None
) -> int:
    console = _console()
    if calls < 1 or workers < 1 or lease_seconds < 1.0:
        _error_console().print("toolfence demo: needs --calls ≥ 1, --workers ≥ 1 and --lease ≥ 1 second")
        return EXIT_USAGE
    requests = build_workload(calls)
    place: Place | None = None
    run: DemoRun | None = None
    outcome = EXIT_INVARIANT_FAILED
    with _signals_raise():
        try:
            place = prepare_place(current())
            with fleet_environment(place.fleet_env(lease_seconds)):
                run = DemoRun(console, place, requests, workers, lease_seconds)
                with demo_console(place, console, serve_port) as served:
                    outcome = _run(run, requests, served)
        except KeyboardInterrupt:
            outcome = EXIT_INTERRUPTED
        except _Terminated:
            outcome = EXIT_TERMINATED
        except DemoError as exc:
            _error_console().print(f"toolfence demo: {exc}")
            outcome = EXIT_USAGE
        except Exception as exc:
            outcome = _report_crash(exc, place)
        finally:
            with _signals_ignored():
                _cleanup(console, run, place, outcome)
    return outcome


def _run(run: DemoRun, requests: Sequence[DemoRequest], served: DemoConsole) -> int:
    console, place = run.console, run.place
    console.print(
        f"[bold]toolfence demo[/]: {_n(run.total_calls, 'call')} in {_n(len(requests), 'request')} "
        f"from 2 tenants, {_n(run.fleet.workers, 'worker')}, lease {run.lease_seconds:g} s"
    )
    console.print(f"  {place.describe()}")
    console.print(f"  run directory {place.run_dir} (logs in logs/)")
    run.setup()
    served.start()  # --serve only: the console on this run's database
    console.print("  schema migrated, ledger opened with 7 accounts; starting relay, workers, reconciler…")
    run.start_fleet()
    waves = split_waves(requests)
    columns = (
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("calls settled"), TimeElapsedColumn(), TextColumn("{task.fields[detail]}"),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        run.progress = progress
        run.task_id = progress.add_task("demo", total=run.total_calls, detail="")
        run.started_at = time.monotonic()
        run.say(f"wave 1: {_n(sum(len(r.calls) for r in waves[0]), 'call')}")
        run.enqueue(waves[0])
        replacement = run.kill_one()
        if waves[1]:
            calls_in_wave = _n(sum(len(r.calls) for r in waves[1]), "call")
            run.say(f"wave 2: {calls_in_wave}, arriving as the fleet keeps up")
        run.feed(waves[1])
        run.pause_one(replacement)
        run.finish_feeding()
        if waves[2]:
            run.say(f"wave 3: {_n(sum(len(r.calls) for r in waves[2]), 'call')}")
        run.enqueue(waves[2])
        quiet = run.wait_until_quiet(
            SETTLE_TIMEOUT_SECONDS, stalled_after=REQUEUE_QUEUED_AFTER_SECONDS + 10.0
        )
        run.tick(force=True)
        if not quiet:
            run.say("[red]the fleet did not settle in time; the checks below say what is stuck[/]")
    seconds = time.monotonic() - run.started_at
    run.progress = None
    # The workload's figures and invariants first, so the turn's calls stay out of them.
    figures = gather(run.engine, requests, place.run_dir / "metrics")
    turn = run_turn(run)
    if served.process is None:
        run.fleet.stop()
    # With --serve the fleet keeps running while the console is up (what the person
    # approves there runs); it stops with the demo, in its cleanup.
    console.print()
    mistakes = next((r for r in requests if r.kind == "mistakes"), None)
    if mistakes is not None:
        console.print(model_view(run.engine, mistakes))
        console.print()
    console.print(
        render(
            figures, calls_total=run.total_calls, requests=len(requests), seconds=seconds, place=place,
            unplanned_exits=run.unplanned_exits,
        )
    )
    console.print()
    console.print(
        f"[bold]A durable turn[/] ({turn.state}, {turn.seconds:.0f} s, a worker killed in the middle):"
    )
    console.print(turn.summary, markup=False, highlight=False)
    for label, ok, detail in turn.checks:
        console.print(f"  turn check: {label}: {'PASS' if ok else 'FAIL'} ({detail})", markup=False)
    passed = figures.all_passed and turn.passed
    if passed:
        console.print("[bold green]All invariants hold.[/]")
    else:
        console.print(f"[bold red]Invariant violated[/]: see the FAIL rows; logs in {place.run_dir / 'logs'}")
    if place.on_sqlite:
        from executor.cli.demo.hints import look_around

        pending, shown = look_around(
            place.run_dir, place.database_url, ["pending"], ["turn", "show", turn.turn_id, "--tenant", "acme"]
        )
        console.print(f"Look around: {pending}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"  and the turn: {shown}", markup=False, highlight=False, soft_wrap=True)
    served.leave_for_a_person()
    served.hold()
    STOP.check()  # a Ctrl-C while the report was printed still ends as an interrupt
    return EXIT_OK if passed else EXIT_INVARIANT_FAILED


def _report_crash(exc: Exception, place: Place | None) -> int:
    """One line for the person, the traceback in the run directory for whoever debugs it."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    where = ""
    if place is not None:
        report = place.run_dir / "demo-error.txt"
        report.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
        where = f"; traceback in {report}, process logs in {place.run_dir / 'logs'}"
    _error_console().print(f"toolfence demo failed: {type(exc).__name__}: {first_line}{where}")
    return EXIT_INVARIANT_FAILED


def _cleanup(console: Console, run: DemoRun | None, place: Place | None, outcome: int) -> None:
    if run is not None:
        run.progress = None
        run.fleet.stop(timeout=8.0)
        run.engine.dispose()
        if outcome in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            started = len(run.fleet.members)
            console.print(f"\ninterrupted: stopped the {started} processes this demo started")
    if place is not None:
        for problem in teardown_place(place):
            console.print(f"toolfence demo: {problem}")
