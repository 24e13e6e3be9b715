"""A driver spec, turned into its driver: `load_driver`.

Above both homes of drivers (`executor.turns.drivers`: scripted and CLI agents,
`executor.turns.sdk`: the providers' SDKs), which therefore never import each other
but in one direction (the SDK drivers raise `DriverError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from executor.settings import read
from executor.turns.drivers import CliAgentDriver, Driver, DriverError, ScriptedDriver
from executor.turns.values import JSON_MODE

DRIVER_KINDS = ("scripted", "cli", "openai-chat", "openai-responses", "anthropic", "gemini")


def load_driver(spec: str, *, env: Mapping[str, str] | None = None) -> Driver:
    """The driver a spec names. `scripted:PATH` (JSON contract), `scripted+SURFACE:PATH`
    (native responses of SURFACE), or `KIND:MODEL` for an SDK driver."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise DriverError("bad_driver_spec", "a driver spec is KIND:ARGUMENT, e.g. scripted:turn.jsonl")
    if kind == "scripted" or kind.startswith("scripted+"):
        surface = kind.partition("+")[2] or JSON_MODE
        return ScriptedDriver(Path(rest), mode=surface)
    if kind == "cli":
        import shlex

        allow = tuple(read("TOOLFENCE_TURN_CLI_ENV_ALLOW", env))
        return CliAgentDriver(tuple(shlex.split(rest)), allow_env=allow)
    if kind.partition("+")[0] in DRIVER_KINDS:
        from executor.turns.sdk import build

        driver: Driver = build(kind, rest, env=env)
        return driver
    raise DriverError(
        "unknown_driver", f"unknown driver kind {kind[:40]!r}: one of {', '.join(DRIVER_KINDS)}"
    )
