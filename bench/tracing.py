"""Tracing's cost: enqueue + relay + execute with traces off and on, and the off path alone.

    python -m bench.tracing [--ops 500] [--repeat 3]

Two rows, interleaved round after round (off, on, then on, off: ABBA) on one fleet shape (a relay, 2 workers,
prefork, concurrency 1, the no-op idempotent write): the producer in this process
enqueues `--ops` one-call requests, the relay publishes them and the workers run
them; the clock runs from the first enqueue to the last terminal row, and the
CPU time of this process and its descendants (producer, relay, workers, pool
children; not PostgreSQL, shared with whatever else runs) is counted over it.

- off: no `OTEL_*` variable anywhere (what every deployment runs unless it asks);
- on: `OTEL_EXPORTER_OTLP_ENDPOINT` at a local OTLP/HTTP sink that accepts and
  drops every export (the exporter's encoding and HTTP cost is paid, a
  collector's is not), in the producer, the relay and the workers.

Then the off path alone, against no tracing code at all: the helpers one
operation passes through when off (the producer's `enqueue_span` and
`stored_context`, the relay's `enabled` and `publish_span`, the worker's
`attempt`, `tool`, `outcome`), timed in a loop in this process beside an empty
loop, as nanoseconds per operation and as a share of an operation's wall time
in the off rows. Nothing here is a timed assertion: the figures are printed, as
markdown, for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench import cpu
from bench.run import (
    DB_NAME,
    apply_env,
    base_env,
    enqueue_calls,
    of_requests,
    pg_url,
    recreate_database,
    toolfence_fleet,
    wait_terminal,
)
from executor.telemetry import tracing

OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_SERVICE_NAME")


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that reads each export and answers 200 with nothing."""

    received = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextmanager
def otlp_sink() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def own_cpu_seconds(before: dict[int, cpu.Process], after: dict[int, cpu.Process]) -> float:
    """CPU seconds this process and its descendants (the producer here, the relay, the
    workers and their pool children) spent between two snapshots: on a machine
    shared with other work, what the rows cost, where their wall time is mostly
    what the neighbours left them."""
    me = os.getpid()

    def ours(pid: int) -> bool:
        seen: set[int] = set()
        while pid not in seen and pid in after:
            if pid == me:
                return True
            seen.add(pid)
            pid = after[pid].parent
        return False

    tick = os.sysconf("SC_CLK_TCK")
    spent = 0
    for pid, process in after.items():
        if ours(pid):
            earlier = before.get(pid)
            start = earlier.ticks if earlier is not None and earlier.started == process.started else 0
            spent += max(0, process.ticks - start)
    return spent / tick


def end_to_end(n: int, engine: Any, log_dir: Path, otel: dict[str, str]) -> tuple[float, float]:
    """(seconds, CPU seconds of toolfence's processes) for n one-call requests, enqueued
    here, through the relay and 2 workers."""
    for name in OTEL_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(otel)
    tracing.shutdown()  # this process decides again, from the variables just set
    prefix = f"tr-{uuid.uuid4().hex[:6]}"
    with toolfence_fleet(log_dir, extra_env=otel):
        before, started = cpu.processes(), time.perf_counter()
        enqueue_calls(engine, "bench.noop_write", n, prefix)
        wait_terminal(engine, of_requests(prefix), n)
        tracing.flush()  # this process's spans, exported inside the window
        elapsed = time.perf_counter() - started
        time.sleep(1.5)  # the fleet's last batches leave (OTEL_BSP_SCHEDULE_DELAY=1000)
        spent = own_cpu_seconds(before, cpu.processes())
    tracing.shutdown()
    return elapsed, spent


def off_path_ns(iterations: int = 200_000) -> tuple[float, float]:
    """(ns per operation through the off path's helpers, ns per iteration of an empty loop)."""
    for name in OTEL_VARIABLES:
        os.environ.pop(name, None)
    tracing.shutdown()
    assert not tracing.enabled()
    row = SimpleNamespace(operation_id="op", request_id="req", trace_context=None)

    def save(text: str) -> None:
        return None

    started = time.perf_counter_ns()
    for _ in range(iterations):
        with tracing.enqueue_span("t", "r", 1):
            tracing.stored_context()
        tracing.enabled()
        with tracing.publish_span("op", None):
            pass
        with tracing.attempt(row, 1, False, 0.0, save) as trace:
            tool = trace.tool("bench.noop_write", "c")
            with tool:
                pass
            trace.outcome("completed")
    helpers = (time.perf_counter_ns() - started) / iterations
    started = time.perf_counter_ns()
    for _ in range(iterations):
        pass
    empty = (time.perf_counter_ns() - started) / iterations
    return helpers, empty


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp/toolfence-bench")) / "tracing"

    recreate_database(DB_NAME)
    from executor.store.engine import make_engine
    from executor.store.migrate import migrate

    migrate(pg_url(DB_NAME))
    apply_env(base_env("bench-setup"))
    engine = make_engine(pg_url(DB_NAME))
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu_ms: dict[str, list[float]] = {"off": [], "on": []}
    with otlp_sink() as endpoint:
        on = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "1000"}
        for round_number in range(args.repeat):
            # ABBA: off first in even rounds, on first in odd ones, so a machine getting
            # busier or quieter through the sitting favours neither row.
            order = (("off", {}), ("on", on))
            for label, otel in order if round_number % 2 == 0 else order[::-1]:
                seconds, spent = end_to_end(args.ops, engine, log_dir / f"{label}-{round_number}", otel)
                rates[label].append(args.ops / seconds)
                cpu_ms[label].append(spent * 1000 / args.ops)
                print(f"round {round_number + 1} tracing {label}: {args.ops / seconds:.1f} ops/s, "
                      f"{cpu_ms[label][-1]:.2f} CPU ms/op", flush=True)
        exports = _Sink.received
    engine.dispose()
    helpers, empty = off_path_ns()
    off, on_rate = statistics.median(rates["off"]), statistics.median(rates["on"])
    per_op_ns = 1e9 / off
    print()
    print("| row | median ops/s | per round | median CPU ms/op (toolfence's processes) | per round |")
    print("|---|---|---|---|---|")
    for label in ("off", "on"):
        print(f"| tracing {label} | {statistics.median(rates[label]):.1f} | "
              + ", ".join(f"{r:.1f}" for r in rates[label])
              + f" | {statistics.median(cpu_ms[label]):.2f} | "
              + ", ".join(f"{c:.2f}" for c in cpu_ms[label]) + " |")
    print()
    print("| ratio | value |")
    print("|---|---|")
    print(f"| tracing on / off (end to end, medians) | {on_rate / off:.3f} |")
    pairs = [o / f for o, f in zip(rates["on"], rates["off"], strict=True)]
    print("| tracing on / off, each round | " + ", ".join(f"{r:.3f}" for r in pairs) + " |")
    cpu_pairs = [o / f for o, f in zip(cpu_ms["on"], cpu_ms["off"], strict=True)]
    print(f"| CPU per operation, on / off (medians) | "
          f"{statistics.median(cpu_ms['on']) / statistics.median(cpu_ms['off']):.3f} |")
    print("| CPU per operation, on / off, each round | " + ", ".join(f"{r:.3f}" for r in cpu_pairs) + " |")
    print(f"| off path: ns per operation (its helpers, minus an empty loop's {empty:.0f} ns) "
          f"| {helpers - empty:.0f} |")
    print(f"| off path / an operation's wall time when off ({per_op_ns / 1e6:.2f} ms) "
          f"| {(helpers - empty) / per_op_ns:.6f} |")
    print(f"| OTLP exports received by the sink (on rows) | {exports} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
