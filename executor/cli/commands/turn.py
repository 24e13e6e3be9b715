"""`toolfence turn start|show`: durable turns, the loop owned by the server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from executor.cli.common import UserError, add_argument, engine_of, print_json, registry_of, settings
from executor.core.types import ServerContext

HELP = "Start a durable turn, or show one."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    turn = subparsers.add_parser(
        "turn", help=HELP, description="Durable turns: the loop owned by the server."
    )
    actions = turn.add_subparsers(dest="turn_command", required=True, metavar="COMMAND")
    parser = actions.add_parser("start", help="Start a turn (prints its id; a worker runs it).")
    parser.set_defaults(func=run_start)
    parser.add_argument("message", help="the user's message")
    parser.add_argument("--tenant", required=True, help="server context: tenant")
    parser.add_argument("--principal", required=True, help="server context: principal")
    parser.add_argument(
        "--roles", default="member", help="comma-separated roles (admission's, never the prompt's)"
    )
    parser.add_argument("--conversation", required=True, help="the conversation the turn belongs to")
    add_argument(
        parser, "--driver", envvar="TOOLFENCE_TURN_DRIVER",
        help="scripted:FILE, openai-chat:MODEL, anthropic:MODEL, …",
    )
    add_argument(
        parser, "--max-steps", envvar="TOOLFENCE_TURN_MAX_STEPS",
        help="model steps before the turn ends fallback",
    )
    parser.add_argument("--max-calls", type=int, default=16, help="tool calls the turn may propose in all")
    parser.add_argument("--fallback", default=None, help="what the user is told when the loop fails")
    add_argument(
        parser, "--when-busy", envvar="TOOLFENCE_TURN_WHEN_BUSY",
        help="the user already has a running turn: refuse (turn_in_progress) or queue behind it",
    )
    add_argument(
        parser, "--surface", envvar="TOOLFENCE_TURN_SURFACE", metavar="NAME",
        help="the turn surface (declared in TOOLFENCE_TOOLS's registry): its catalog, write rule "
        "and listed targets apply to the whole turn",
    )
    parser = actions.add_parser("show", help="Show a turn: state, steps, calls with results, final output.")
    parser.set_defaults(func=run_show)
    parser.add_argument("turn_id")
    parser.add_argument("--tenant", required=True, help="the turn's tenant")
    parser.add_argument("--json", action="store_true", help="the whole turn as JSON")


def run_start(args: argparse.Namespace) -> int:
    from executor.cli.commands.keys import undeclared_surface
    from executor.core.surfaces import UnknownSurface
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
    try:
        load_driver(driver)
    except DriverError as exc:
        raise UserError(f"--driver {args.driver!r}: {exc}") from None
    context = ServerContext(
        principal=args.principal, tenant=args.tenant,
        roles=frozenset(r for r in args.roles.split(",") if r), request_id="turn",
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
                conn, context, args.conversation, args.message, driver=driver, options=options,
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


def run_show(args: argparse.Namespace) -> int:
    from executor.turns.service import get_turn, turn_summary

    engine = engine_of(settings())
    view = get_turn(engine, args.tenant, args.turn_id)
    if view is None:
        raise UserError(f"no turn {args.turn_id!r} in tenant {args.tenant!r}")
    if args.json:
        print_json(view)
        return 0
    print(turn_summary(view))
    return 0
