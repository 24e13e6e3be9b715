"""One atheris target per process: `python -m bench.fuzz.harness TARGET STATS [libFuzzer flags]`.

Each target decodes the fuzzer's bytes into the input its entry point takes and
calls the same function the suite's Hypothesis tests call (tests/fuzz/targets.py,
tests/fuzz/http_targets.py): any exception it lets through is a crash. The
harness keeps going after one: it counts the failing inputs, files each under a
signature (exception type, message with numbers blanked, and the innermost
frame of toolfence's or the target's code) and keeps the first input of each
signature in ARTIFACTS (`failure-<n>`), so one run reports every distinct
failure, not only the first. It also counts executions, 5xx answers (the HTTP
targets) and the slowest input, written to STATS (JSON) as it goes, so
`bench/fuzz/run.py` can report them whatever way libFuzzer ends the process.

    python -m bench.fuzz.harness TARGET STATS ARTIFACTS [libFuzzer flags]
    python -m bench.fuzz.harness TARGET --replay FILE     # one input, the exception raised

Environment: TOOLFENCE_FUZZ_SQLITE_URL and TOOLFENCE_FUZZ_PG_URL name migrated
databases for the enqueue, hosted and HTTP targets (run.py makes private ones),
TOOLFENCE_FUZZ_WORKDIR a directory the HTTP targets may write to.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import atheris

with atheris.instrument_imports(include=["executor", "outbox"]):
    from executor.core.types import ProposedCall
    from tests.fuzz import shapes, targets

T = TypeVar("T")

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
    with engine.begin() as setup:
        setup.execute(text("CREATE TABLE IF NOT EXISTS fuzz_business_rows (note TEXT NOT NULL)"))
    conn = engine.connect()  # each input runs in a transaction of its own on it

    def run(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        calls: dict[str, ProposedCall] = {}
        for _ in range(fdp.ConsumeIntInRange(0, 3)):
            call = _call(fdp)
            calls.setdefault(call.call_id, call)
        targets.enqueue_in_rolled_back_transaction(conn, list(calls.values()))

    return run


class FdpPicker:
    """A `shapes.Picker` consuming libFuzzer's bytes. libFuzzer starts from short
    inputs and the provider answers 0 once the bytes run out, so `count` is
    counted down from `most`: a short input is then a full, well-formed shape
    (every loop at its longest, every field present, each menu's first, ordinary
    choice) that mutation bends, not an empty one."""

    def __init__(self, fdp: atheris.FuzzedDataProvider) -> None:
        self.fdp = fdp

    def pick(self, menu: Sequence[T]) -> T:
        return menu[self.fdp.ConsumeIntInRange(0, len(menu) - 1)]

    def text(self, most: int) -> str:
        return str(self.fdp.ConsumeUnicode(self.fdp.ConsumeIntInRange(0, most)))

    def count(self, most: int) -> int:
        return most - int(self.fdp.ConsumeIntInRange(0, most))

    def flag(self) -> bool:
        return bool(self.fdp.ConsumeBool())

    def raw(self, most: int) -> bytes:
        return bytes(self.fdp.ConsumeBytes(self.fdp.ConsumeIntInRange(0, most)))


def _hosted(surface: str) -> Callable[[bytes], None]:
    """An envelope of `surface`: built from choices (mostly hosted items at their
    edges), or, when the first byte says so, the rest of the bytes as JSON."""
    from executor.store.engine import make_engine

    engine = make_engine(os.environ["TOOLFENCE_FUZZ_PG_URL"])
    targets.create_business_table(engine)

    def run(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        envelope: Any = None
        if fdp.ConsumeIntInRange(0, 7) == 0:
            envelope = targets.json_or_none(fdp.ConsumeBytes(len(data)))
        if envelope is None:
            envelope = shapes.hosted_envelope(surface, FdpPicker(fdp))
        LAST["input"] = envelope
        targets.hosted_enqueue(engine, surface, envelope)

    return run


_RIGS: list[Any] = []
LAST: dict[str, Any] = {}
"""The input the structured targets built from the last bytes (shown for a failure)."""


def _http(kind: str) -> Callable[[bytes], None]:
    from tests.fuzz.http_targets import HttpRig

    workdir = Path(os.environ.get("TOOLFENCE_FUZZ_WORKDIR") or tempfile.mkdtemp(prefix="toolfence-fuzz-"))
    rig = HttpRig(os.environ["TOOLFENCE_FUZZ_PG_URL"], workdir)
    _RIGS.append(rig)

    def run(data: bytes) -> None:
        picker = FdpPicker(atheris.FuzzedDataProvider(data))
        if kind == "api":
            request = shapes.http_request(picker, rig.keys, rig.ids)
            LAST["input"] = request
            rig.api(request)
        else:
            request, cookie = shapes.console_request(picker, rig.keys, rig.ids, rig.csrf)
            LAST["input"] = (request, cookie)
            rig.console(request, cookie)

    return run


def server_errors() -> int:
    """5xx answers the HTTP targets saw so far."""
    return sum(int(rig.server_errors) for rig in _RIGS)


def make_target(name: str) -> Callable[[bytes], None]:
    if name.startswith("hosted:"):
        return _hosted(name.split(":", 1)[1])
    if name in ("http_api", "http_console"):
        return _http(name.removeprefix("http_"))
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


def signature(exc: BaseException) -> str:
    """What tells one failure from another: the exception's type, its message's first
    line with numbers and escaped characters blanked, and the innermost frame in
    toolfence's code (executor, outbox, ledger) or the fuzz targets, through the
    chain of causes."""
    message = str(exc).splitlines()[0] if str(exc) else ""
    if type(exc).__name__ != "ContractBroken":  # its messages name statuses and SQLSTATEs
        message = re.sub(r"'\\[uUx][0-9a-fA-F]+'", "'…'", message)  # which surrogate, which byte
        message = re.sub(r"\b\d+\b", "#", message)
    message = message[:160]
    site = ""
    chain: list[BaseException] = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 5:
        chain.append(chain[-1].__cause__)  # the innermost site of the deepest cause
    for link in chain:
        for frame in traceback.extract_tb(link.__traceback__):
            if re.search(r"/(executor|outbox|ledger|tests/fuzz)/", frame.filename):
                site = re.sub(r"^.*?/(executor|outbox|ledger|tests)/", r"\1/", frame.filename)
                site = f"{site}:{frame.lineno}"
    cause = exc.__cause__ or exc.__context__
    caused = f" <- {type(cause).__name__}" if cause is not None else ""
    return f"{type(exc).__name__}{caused}: {message} @ {site}"


def _shown(value: Any) -> str:
    """A failing input as Python would write it, cut to 600 characters."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        text = f"<{type(value).__name__} too deep to show>"
    return text if len(text) <= 600 else text[:600] + f"... ({len(text):,} characters)"


class _Stats:
    """Executions, failures by signature and the slowest input so far, flushed to a
    JSON file."""

    def __init__(self, path: str, artifacts: str) -> None:
        self.path = path
        self.artifacts = Path(artifacts)
        self.executions = 0
        self.crashes = 0
        self.failures: dict[str, dict[str, Any]] = {}
        self.slowest_seconds = 0.0
        self.slowest_input: dict[str, Any] = {}
        self._flushed_at = time.monotonic()

    def failed(self, data: bytes, exc: BaseException) -> None:
        self.crashes += 1
        key = signature(exc)
        known = self.failures.get(key)
        if known is not None:
            known["count"] += 1
            return
        self.artifacts.mkdir(parents=True, exist_ok=True)
        kept = self.artifacts / f"failure-{len(self.failures) + 1}"
        kept.write_bytes(data)
        self.failures[key] = {"count": 1, "reproducer": str(kept), "bytes": len(data),
                              "input": _shown(LAST.pop("input", data))}
        self.flush()

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
            json.dump({"executions": self.executions, "crashes": self.crashes,
                       "server_errors": server_errors(), "failures": self.failures,
                       "slowest_seconds": self.slowest_seconds, "slowest_input": self.slowest_input}, handle)
        os.replace(self.path + ".tmp", self.path)
        self._flushed_at = time.monotonic()


def main() -> None:
    name, stats_path, *rest = sys.argv[1:]
    target = make_target(name)
    if stats_path == "--replay":
        try:
            target(Path(rest[0]).read_bytes())
        except Exception:
            print(f"input: {_shown(LAST.get('input'))}", file=sys.stderr)
            raise
        print(f"input: {_shown(LAST.get('input'))}\npassed", file=sys.stderr)
        return
    artifacts, *flags = rest
    stats = _Stats(stats_path, artifacts)

    def one_input(data: bytes) -> None:
        started = time.perf_counter()
        try:
            target(data)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and filed
            stats.failed(data, exc)
        finally:
            stats.record(data, time.perf_counter() - started)

    import atexit

    atexit.register(stats.flush)
    atheris.Setup([sys.argv[0], *flags], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
