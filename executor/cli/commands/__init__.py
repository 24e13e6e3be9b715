"""One module per `toolfence` command: `configure_parser(subparsers)` declares its
parser and arguments, `run(args) -> int` (or `run_<action>` for a command with
actions) handles it. `COMMANDS` is the order `toolfence --help` lists them in."""

from __future__ import annotations

from types import ModuleType

from executor.cli.commands import (
    approvals,
    approve,
    check,
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
    serve,
    show,
    turn,
    worker,
)

COMMANDS: tuple[ModuleType, ...] = (
    migrate, demo, worker, relay, reconcile, check, metrics, enqueue, serve, keys, results, show,
    approvals, approve, deny, turn, eval, pending, resolve, config,
)
