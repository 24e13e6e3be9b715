"""`toolfence turn start|show`: durable turns, the loop owned by the server."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

from executor.cli.args import UserError, add_actor, add_argument, add_option, roles_of, seconds, usage_error

HELP = "Start a durable turn, or show one."
START_DESCRIPTION = """\
Start a durable turn: record the user's message and who sent it, and queue the
turn for a worker (the relay publishes it). The loop is the server's: the driver
(--driver) proposes tool calls, admission decides, workers execute, results go
back to the model, until it answers, a limit is reached or a call waits for a
person. Prints the turn's id; `toolfence turn show ID --tenant T --wait 30`
follows it."""
SHOW_DESCRIPTION = """\
Show a turn: its state and end reason (and why, when it fell back or failed), each
step with the calls it proposed and their results, and the final output. With
--wait, first wait until the turn has ended or waits for a person's approval."""
POLL_SECONDS = 0.2
"""How often `turn show --wait` reads the turn again."""


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    turn = subparsers.add_parser(
        "turn", help=HELP, description="Durable turns: the loop owned by the server."
    )
    actions = turn.add_subparsers(dest="turn_command", required=True, metavar="COMMAND")
    parser = actions.add_parser(
        "start", help="Start a turn (prints its id; a worker runs it).", description=START_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=run_start)
    parser.add_argument("message", help="the user's message")
    add_actor(
        parser, tenant_help="server context: tenant", principal_help="server context: principal",
        role_help="server context: a role (repeat, or comma-separate; admission's, never the prompt's)",
        default_roles=["member"],
    )
    add_option(
        parser, "--conversation-id", aliases=["--conversation"], required=True,
        help="the conversation the turn belongs to",
    )
    add_argument(
        parser, "--driver", envvar="TOOLFENCE_TURN_DRIVER",
        help="scripted:FILE, openai-chat:MODEL, anthropic:MODEL, …",
    )
    add_argument(
        parser, "--max-steps", envvar="TOOLFENCE_TURN_MAX_STEPS",
        help="model steps before the turn ends fallback",
    )
    parser.add_argument(
        "--max-calls", type=int, default=16, metavar="N",
        help="tool calls the turn may propose in all (default: 16)",
    )
    parser.add_argument(
        "--fallback", default=None, metavar="TEXT", help="what the user is told when the loop fails"
    )
    add_argument(
        parser, "--when-busy", envvar="TOOLFENCE_TURN_WHEN_BUSY",
        help="the user already has a running turn: refuse (turn_in_progress) or queue behind it",
    )
    add_argument(
        parser, "--surface", envvar="TOOLFENCE_TURN_SURFACE", metavar="NAME",
        help="the turn surface (declared in TOOLFENCE_TOOLS's registry): its catalog, write rule "
        "and listed targets apply to the whole turn",
    )
    parser = actions.add_parser(
        "show", help="Show a turn: state, steps, calls with results, final output.",
        description=SHOW_DESCRIPTION,
    )
    parser.set_defaults(func=run_show)
    parser.add_argument("turn_id", help="the turn's id (as `turn start` printed it)")
    parser.add_argument(
        "--tenant", required=True, help="the turn's tenant (another tenant's turn is answered as unknown)"
    )
    parser.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="wait up to SECONDS for the turn to end or to wait for an approval (default: 0, no wait)",
    )
    parser.add_argument("--json", action="store_true", help="the whole turn as JSON")


def run_start(args: argparse.Namespace) -> int:
    from executor.cli.commands.keys import undeclared_surface
    from executor.cli.common import engine_of, registry_of, settings
    from executor.core.surfaces import UnknownSurface
    from executor.core.types import ServerContext
    from executor.turns.drivers import DriverError
    from executor.turns.service import TurnInProgress, start_turn
    from executor.turns.specs import load_driver
    from executor.turns.values import TurnOptions

    chosen = settings()
    engine = engine_of(chosen)
    driver = args.driver or chosen.turn_driver
    if not driver:
        raise UserError("say which model runs the turn: --driver scripted:FILE (or TOOLFENCE_TURN_DRIVER)")
    if driver.startswith("scripted"):
        # The worker reads the script: a relative path would be relative to its cwd.
        kind, _, path = driver.partition(":")
        driver = f"{kind}:{Path(path).resolve()}"
        if path:
            _require_readable_script(args.driver or "", Path(path))
    try:
        load_driver(driver)
    except DriverError as exc:
        raise UserError(f"--driver {args.driver!r}: {exc}") from None
    context = ServerContext(
        principal=args.principal, tenant=args.tenant,
        roles=roles_of(args), request_id="turn",
    )
    try:
        options = TurnOptions(
            max_steps=args.max_steps or chosen.turn_max_steps, max_calls=args.max_calls,
            **({"fallback_output": args.fallback} if args.fallback is not None else {}),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    surface = args.surface or chosen.turn_surface
    # The registry the worker will load: a surface it does not declare is refused here,
    # before anything is written, rather than ending the turn failed later.
    registry = registry_of(chosen) if surface else None
    try:
        with engine.begin() as conn:
            handle = start_turn(
                conn, context, args.conversation_id, args.message, driver=driver, options=options,
                when_busy=args.when_busy, surface=surface, registry=registry,
            )
    except UnknownSurface:
        assert registry is not None
        raise undeclared_surface(registry) from None
    except TurnInProgress as exc:
        raise UserError(f"turn_in_progress: {exc}") from None
    print(handle.turn_id)
    if handle.state != "running":
        print(f"queued behind the running turn of this {chosen.turn_scope}", file=sys.stderr)
    return 0


def _require_readable_script(given: str, path: Path) -> None:
    """A scripted driver's file must be a readable regular file now: the worker reads
    it later, and a missing one ended the turn `fallback (driver_failed)` after
    `turn start` had answered 0. Refused at start, one line, exit 2."""
    spec = f"--driver {given!r}" if given else "TOOLFENCE_TURN_DRIVER"
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise usage_error(f"{spec}: cannot read {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise usage_error(f"{spec}: {path} is not a regular file")
    finally:
        os.close(descriptor)


def run_show(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, print_json, settings
    from executor.turns.service import get_turn, turn_summary

    wait = seconds(args.wait, "--wait")
    engine = engine_of(settings())
    view = get_turn(engine, args.tenant, args.turn_id)
    if view is None:
        raise UserError(f"no turn {args.turn_id!r} in tenant {args.tenant!r}")
    deadline = time.monotonic() + wait
    while not _settled(view) and time.monotonic() < deadline:
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        view = get_turn(engine, args.tenant, args.turn_id) or view
    if args.json:
        print_json(_with_iso_times(view))
        return 0
    print(turn_summary(_with_iso_times(view)))
    return 0


def _settled(view: dict[str, Any]) -> bool:
    """Ended, or waiting for a person: waiting longer would not change it."""
    from executor.core.states import TURN_ENDED, TurnState

    return view["state"] in TURN_ENDED or view["state"] == TurnState.WAITING_APPROVAL


def _with_iso_times(view: dict[str, Any]) -> dict[str, Any]:
    """The turn with its times, and its calls' freshness times, in ISO 8601 UTC."""
    from executor.cli.common import iso, status_json

    steps = [{**step, "calls": [status_json(call) for call in step["calls"]]} for step in view["steps"]]
    return {
        **view, "steps": steps,
        "created_at": iso(view.get("created_at")), "finished_at": iso(view.get("finished_at")),
    }
