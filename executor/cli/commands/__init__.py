"""One module per `toolfence` command: `HELP` is its line in `toolfence --help`,
`configure_parser(subparsers)` declares its parser and arguments, `run(args) -> int`
(or `run_<action>` for a command with actions) handles it. `COMMANDS` is the order
`toolfence --help` lists them in.

A command module imports only the standard library and `executor.cli.args` at its
top: its implementation's imports go inside `run` (executor/cli/args.py)."""

from __future__ import annotations

from types import ModuleType

from executor.cli.commands import (
    approvals,
    approve,
    check,
    completion,
    config,
    demo,
    deny,
    enqueue,
    eval,
    keys,
    metrics,
    migrate,
    pending,
    reconcile,
    relay,
    resolve,
    results,
    sandbox,
    serve,
    show,
    turn,
    worker,
)

COMMANDS: tuple[ModuleType, ...] = (
    migrate, demo, worker, relay, reconcile, check, metrics, enqueue, serve, keys, results, show,
    approvals, approve, deny, turn, eval, pending, resolve, sandbox, config, completion,
)


def command_name(module: ModuleType) -> str:
    """The command a module declares: its module name (`executor.cli.commands.turn`)."""
    return module.__name__.rpartition(".")[2]
