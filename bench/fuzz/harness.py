"""One atheris target per process: `python -m bench.fuzz.harness TARGET STATS [libFuzzer flags]`.

Each target decodes the fuzzer's bytes into the input its entry point takes and
calls the same function the suite's Hypothesis tests call (tests/fuzz/targets.py):
any exception it lets through is a crash, which libFuzzer saves and stops on.
The harness itself counts executions and keeps the slowest input, written to
STATS (JSON) as it goes, so `bench/fuzz/run.py` can report them whatever way
libFuzzer ends the process.

Environment: TOOLFENCE_FUZZ_SQLITE_URL and TOOLFENCE_FUZZ_PG_URL name migrated
databases for the enqueue targets (run.py makes private ones).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import atheris

with atheris.instrument_imports(include=["executor", "outbox"]):
    from executor.core.types import ProposedCall
    from tests.fuzz import targets

SURFACES = ("openai-chat", "openai-responses", "anthropic", "gemini", "gemini-interactions")


def _call(fdp: atheris.FuzzedDataProvider) -> ProposedCall:
    """A proposed call: an id and a tool name (a real one, or fuzzer text), and
    arguments as text, bytes or a JSON object."""
    call_id = fdp.ConsumeUnicodeNoSurrogates(12) if fdp.ConsumeBool() else fdp.ConsumeUnicode(12)
    names = [*targets.REGISTRY.names(), "tf--_ed_a0_80", "tf--mcp_2etime_2fget"]
    pick = fdp.ConsumeIntInRange(0, len(names) - 1)
    tool_name = names[pick] if fdp.ConsumeBool() else fdp.ConsumeUnicode(16)
    kind = fdp.ConsumeIntInRange(0, 2)
    raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 512))
    arguments: Any
    if kind == 0:
        arguments = raw.decode("utf-8", "surrogatepass") if _decodes(raw) else raw.decode("latin-1")
    elif kind == 1:
        arguments = raw
    else:
        value = targets.json_or_none(raw)
        arguments = value if isinstance(value, dict) else {"city": raw.decode("latin-1")}
    return ProposedCall(call_id=call_id or "c", tool_name=tool_name or "t", arguments=arguments)


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


def _admit(data: bytes) -> None:
    targets.admit_call(_call(atheris.FuzzedDataProvider(data)))


def _adapter(surface: str) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        value = targets.json_or_none(data)
        targets.adapter(surface, value if value is not None else data.decode("latin-1"))

    return run


def _neutral(data: bytes) -> None:
    value = targets.json_or_none(data)
    targets.neutral_calls(value)


def _cli(data: bytes) -> None:
    targets.cli_input(data)


def _enqueue(url_variable: str) -> Callable[[bytes], None]:
    from sqlalchemy import text

    from executor.store.engine import make_engine

    engine = make_engine(os.environ[url_variable])
    conn = engine.connect()
    conn.begin()
    conn.execute(text("CREATE TABLE IF NOT EXISTS fuzz_business_rows (note TEXT NOT NULL)"))

    def run(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        calls: dict[str, ProposedCall] = {}
        for _ in range(fdp.ConsumeIntInRange(0, 3)):
            call = _call(fdp)
            calls.setdefault(call.call_id, call)
        targets.enqueue_in_rolled_back_transaction(conn, list(calls.values()))

    return run


def make_target(name: str) -> Callable[[bytes], None]:
    if name == "admit":
        return _admit
    if name.startswith("adapter:"):
        return _adapter(name.split(":", 1)[1])
    if name == "neutral_calls":
        return _neutral
    if name == "cli_input":
        return _cli
    if name == "enqueue_sqlite":
        return _enqueue("TOOLFENCE_FUZZ_SQLITE_URL")
    if name == "enqueue_postgresql":
        return _enqueue("TOOLFENCE_FUZZ_PG_URL")
    raise SystemExit(f"unknown target {name!r}")


WARM_UP_RUNS = 50


class _Stats:
    """Executions and the slowest input so far, flushed to a JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.executions = 0
        self.slowest_seconds = 0.0
        self.slowest_input: dict[str, Any] = {}
        self._flushed_at = time.monotonic()

    def record(self, data: bytes, seconds: float) -> None:
        self.executions += 1
        # The first runs pay for imports and lazy setup, not for their input.
        if self.executions > WARM_UP_RUNS and seconds > self.slowest_seconds:
            self.slowest_seconds = seconds
            self.slowest_input = {
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest()[:16],
                "head": data[:40].decode("latin-1").encode("unicode_escape").decode("ascii")[:60],
            }
        if time.monotonic() - self._flushed_at > 1.0:
            self.flush()

    def flush(self) -> None:
        with open(self.path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump({"executions": self.executions, "slowest_seconds": self.slowest_seconds,
                       "slowest_input": self.slowest_input}, handle)
        os.replace(self.path + ".tmp", self.path)
        self._flushed_at = time.monotonic()


def main() -> None:
    name, stats_path, *flags = sys.argv[1:]
    target = make_target(name)
    stats = _Stats(stats_path)

    def one_input(data: bytes) -> None:
        started = time.perf_counter()
        try:
            target(data)
        finally:
            stats.record(data, time.perf_counter() - started)

    import atexit

    atexit.register(stats.flush)
    atheris.Setup([sys.argv[0], *flags], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
