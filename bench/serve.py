"""`toolfence serve` against a minimal FastAPI endpoint doing the same writes.

    python -m bench.serve [--requests 1500] [--rounds 3] [--workers 1,1r,2] [--profile]
                          [--write bench/SERVE.md]

On the local PostgreSQL (`BENCH_PG`, default postgresql://postgres@127.0.0.1:5432),
in a database of its own; every server in its own process on loopback, driven by
the same client: 8 threads, each with one keep-alive connection (http.client), a
bounded count of `POST`s of one no-op idempotent write, interleaved rounds, medians.

- **floor**: FastAPI on uvicorn, one process, a sync route (Starlette's threadpool)
  over a small pool of psycopg connections: the API key looked up per request (one
  SELECT by key id, the secret's SHA-256 compared in constant time), a pydantic body,
  then BEGIN, INSERT the operation, INSERT the outbox row, NOTIFY, COMMIT; 202 with
  the call's status.
- **serve ×N**: `toolfence serve --workers N`, `POST /v1/requests` with a real key
  (`bench.tools`' `bench.noop_write`), the per-key limit set out of the way. One
  worker counts the limits in memory (`1`) or in Redis (`1r`); more than one share
  them through Redis (`BENCH_REDIS`, default redis://127.0.0.1:6379/15), as
  `toolfence serve` requires.

With `--profile`, py-spy samples the one-worker server during an extra run and the
functions holding most samples are written below the figures.

A bench, not a test: figures are printed and written, never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parents[1]
BASE = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15")
DATABASE = "toolfence_bench_serve"
THREADS = 8
FLOOR_POOL = 8


# ------------------------------------------------------------------ the floor


class Call(BaseModel):
    model_config = ConfigDict(extra="forbid")
    call_id: str = Field(min_length=1, max_length=200)
    tool_name: str = Field(min_length=1, max_length=200)
    arguments: dict[str, object] | str


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    calls: list[Call] = Field(min_length=1, max_length=100)
    conversation_id: str | None = None


def floor_app(dsn: str) -> object:
    """The plain endpoint: what a team would write by hand for the same promise."""
    import psycopg
    from fastapi import FastAPI, Header, HTTPException

    connections: queue.LifoQueue[psycopg.Connection[tuple[object, ...]]] = queue.LifoQueue()
    for _ in range(FLOOR_POOL):
        connections.put(psycopg.connect(dsn, autocommit=True))
    app = FastAPI()

    @app.post("/v1/requests", status_code=202)
    def submit(batch: Batch, authorization: str = Header()) -> dict[str, object]:
        key_id, _, secret = authorization.removeprefix("Bearer ").partition(".")
        conn = connections.get()
        try:
            row = conn.execute(
                "SELECT tenant, secret_digest, revoked FROM plain_keys WHERE key_id = %s", (key_id,)
            ).fetchone()
            digest = hashlib.sha256(secret.encode()).digest()
            if row is None or row[2] or not hmac.compare_digest(bytes(row[1]), digest):  # type: ignore[call-overload]
                raise HTTPException(401)
            request_id = f"req_{uuid.uuid4().hex[:24]}"
            statuses = []
            with conn.transaction():
                for call in batch.calls:
                    operation_id = f"op_{uuid.uuid4().hex}"
                    conn.execute(
                        "INSERT INTO plain_operations VALUES (%s, %s, %s, %s, %s, 'queued', "
                        "extract(epoch from clock_timestamp()))",
                        (operation_id, request_id, row[0], call.tool_name, json.dumps(call.arguments)),
                    )
                    conn.execute(
                        "INSERT INTO plain_outbox (operation_id, created_at) "
                        "VALUES (%s, extract(epoch from clock_timestamp()))",
                        (operation_id,),
                    )
                    statuses.append(
                        {"call_id": call.call_id, "operation_id": operation_id, "state": "queued"}
                    )
                conn.execute("NOTIFY plain_outbox")
        finally:
            connections.put(conn)
        return {"request_id": request_id, "calls": statuses, "settled": False}

    return app


def prepare_floor(dsn: str) -> str:
    """The floor's tables and its one key; returns the key's text."""
    import psycopg

    secret = uuid.uuid4().hex
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE plain_keys (key_id text PRIMARY KEY, tenant text NOT NULL, "
            "secret_digest bytea NOT NULL, revoked boolean NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE plain_operations (operation_id text PRIMARY KEY, request_id text NOT NULL, "
            "tenant text NOT NULL, tool_name text NOT NULL, arguments text NOT NULL, state text NOT NULL, "
            "created_at double precision NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE plain_outbox (id bigserial PRIMARY KEY, operation_id text NOT NULL, "
            "created_at double precision NOT NULL)"
        )
        digest = hashlib.sha256(secret.encode()).digest()
        conn.execute("INSERT INTO plain_keys VALUES ('k1', 'bench', %s, false)", (digest,))
    return f"k1.{secret}"


def serve_floor(port: int, dsn: str) -> None:
    import uvicorn

    uvicorn.run(
        floor_app(dsn), host="127.0.0.1", port=port, log_level="warning", lifespan="off",  # type: ignore[arg-type]
        server_header=False,
    )


# ------------------------------------------------------------------ servers


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    name: str
    port: int
    key: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_ready(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited {process.returncode}: {log.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"server on {port} did not answer: {log.read_text()[-2000:]}")


def start_floor(dsn: str, key: str, logs: Path) -> Server:
    port = free_port()
    log = logs / "floor.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.serve", "--floor-server", str(port), dsn],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    # The floor has no /healthz: any answer (404) says it is up.
    wait_ready(process, port, log)
    return Server("floor", port, key, process)


@dataclass(frozen=True)
class Variant:
    """`toolfence serve` with `workers` processes, its limits in Redis or in memory."""

    workers: int
    redis: bool

    @classmethod
    def parse(cls, text: str) -> Variant:
        workers = int(text.rstrip("r"))
        return cls(workers, workers > 1 or text.endswith("r"))

    @property
    def name(self) -> str:
        return f"serve ×{self.workers}" + (" (Redis)" if self.redis and self.workers == 1 else "")


def start_serve(url: str, key: str, variant: Variant, logs: Path) -> Server:
    workers = variant.workers
    port = free_port()
    log = logs / f"serve{workers}{'r' if variant.redis else ''}.log"
    env = {
        **os.environ,
        "TOOLFENCE_DATABASE_URL": url,
        "TOOLFENCE_BROKER_URL": f"filesystem://{logs / 'broker'}",
        "TOOLFENCE_TOOLS": "bench.tools:registry",
        "TOOLFENCE_HOME": str(logs / "home"),
        "TOOLFENCE_HTTP_RATE_LIMIT": "100000000/minute",
        "TOOLFENCE_HTTP_RATE_LIMIT_STORAGE": REDIS if variant.redis else "memory://",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "executor.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if workers > 1:
        command += ["--workers", str(workers)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_ready(process, port, log)
    return Server(variant.name, port, key, process)


# ------------------------------------------------------------------ the client


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its children (a supervisor's workers), so far."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        pending += [int(c) for c in children]
    return total


@dataclass
class Run:
    seconds: float
    latencies: list[float]
    statuses: Counter[int]
    cpu: float = 0.0

    @property
    def cpu_ms(self) -> float:
        """The server's CPU per request, in milliseconds: what load on the machine
        does not change (a busy machine stretches wall time, not CPU time)."""
        return self.cpu / len(self.latencies) * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def drive(server: Server, requests: int, tag: str) -> Run:
    """`requests` POSTs from THREADS threads, each on one keep-alive connection."""
    counter = iter(range(requests))
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    start = threading.Barrier(THREADS + 1)

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        headers = {"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"}
        mine: list[float] = []
        codes: Counter[int] = Counter()
        start.wait()
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            body = json.dumps(
                {"calls": [{"call_id": f"{tag}-{i}", "tool_name": "bench.noop_write", "arguments": {"n": i}}]}
            )
            began = time.perf_counter()
            conn.request("POST", "/v1/requests", body=body, headers=headers)
            response = response_of(conn)
            response.read()
            mine.append(time.perf_counter() - began)
            codes[response.status] += 1
        conn.close()
        with lock:
            latencies.extend(mine)
            statuses.update(codes)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    cpu_before = cpu_seconds(server.process.pid)
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    return Run(elapsed, latencies, statuses, cpu_seconds(server.process.pid) - cpu_before)


def response_of(conn: http.client.HTTPConnection) -> http.client.HTTPResponse:
    return conn.getresponse()


# ------------------------------------------------------------------ profile


def profile(server: Server, requests: int, out: Path) -> list[str]:
    """py-spy's samples of every process of `server` during a run: the functions most
    often on the stack (inclusive) and at its top (self), by share of samples."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = out / "serve.folded"
    sampler = subprocess.Popen(
        [spy, "record", "--pid", str(server.process.pid), "--subprocesses", "--format", "raw",
         "--rate", "250", "--gil", "--output", str(raw), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    drive(server, requests, f"profile-{time.time_ns()}")
    sampler.send_signal(signal.SIGINT)
    sampler.wait(timeout=60)
    if not raw.exists():
        return ["(py-spy wrote no samples: is ptrace allowed here?)"]
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                  for f in stack.split(";")[1:] if f]
        if not frames or "drive" in stack:
            continue
        idle = any(word in frames[-1] for word in (
            "select (selectors", "wait (threading", "_worker (thread", "get (queue", "poll (selectors",
            "wait (connection", "wait (waiting",
        ))
        if idle:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [
        f"{total} samples of the thread holding the GIL (py-spy --gil; idle waits left out).", "",
        "| on the stack | share |", "| --- | ---: |",
    ]
    lines += [f"| `{name}` | {n / total:.0%} |" for name, n in inclusive.most_common(70)]
    lines += ["", "| at the top (self) | share |", "| --- | ---: |"]
    lines += [f"| `{name}` | {n / total:.0%} |" for name, n in own.most_common(40)]
    return lines


# ------------------------------------------------------------------ main


def settle_statistics(dsn: str) -> None:
    """ANALYZE, as autovacuum would have by now on a live database (bench/run.py's
    `settle_statistics`; decision 0235). Before a round, never inside it."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")


def fresh_database() -> tuple[str, str]:
    import psycopg

    with psycopg.connect(f"{BASE}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    dsn = f"{BASE}/{DATABASE}"
    return dsn, dsn.replace("postgresql://", "postgresql+psycopg://")


def toolfence_key(url: str) -> str:
    from executor.http.keys import KeyScope, create_key
    from executor.store.engine import make_engine
    from executor.store.migrate import migrate

    migrate(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        key = create_key(conn, tenant="bench", principal="bench", roles=["member"], scopes=[KeyScope.PRODUCE])
    engine.dispose()
    return key


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(REDIS).flushdb()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workers", default="1,1r,2",
        help="worker counts of toolfence serve, comma-separated (1r: one worker, limits in Redis)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the one-worker server")
    parser.add_argument("--write", default=str(ROOT / "bench" / "SERVE.md"))
    parser.add_argument("--floor-server", nargs=2, metavar=("PORT", "DSN"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_server:
        serve_floor(int(args.floor_server[0]), args.floor_server[1])
        return 0
    worker_counts = [Variant.parse(n.strip()) for n in args.workers.split(",") if n.strip()]
    dsn, url = fresh_database()
    floor_key = prepare_floor(dsn)
    key = toolfence_key(url)
    flush_redis()
    logs = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    load_before = os.getloadavg()
    servers = [start_floor(dsn, floor_key, logs)]
    try:
        servers += [start_serve(url, key, n, logs) for n in worker_counts]
        for server in servers:  # warm: connections, imports, the key's first verification
            drive(server, 200, f"warm-{server.name}-{time.time_ns()}")
        runs: dict[str, list[Run]] = {s.name: [] for s in servers}
        for round_no in range(args.rounds):
            order = servers if round_no % 2 == 0 else list(reversed(servers))
            for server in order:
                settle_statistics(dsn)
                run = drive(server, args.requests, f"r{round_no}-{time.time_ns()}")
                runs[server.name].append(run)
                print(f"round {round_no + 1}: {server.name} {run.rate:.0f} req/s, p50 "
                      f"{run.percentile(0.5) * 1000:.1f} ms, CPU {run.cpu_ms:.2f} ms/request, "
                      f"statuses {dict(run.statuses)}", flush=True)
        profiled = profile(servers[1], args.requests, logs) if args.profile and worker_counts else []
    finally:
        for server in servers:
            server.stop()
    load_after = os.getloadavg()
    lines = report(args, runs, worker_counts, load_before, load_after, profiled)
    Path(args.write).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def report(
    args: argparse.Namespace, runs: dict[str, list[Run]], worker_counts: list[Variant],
    load_before: tuple[float, float, float], load_after: tuple[float, float, float], profiled: list[str],
) -> list[str]:
    def median(name: str, value: str) -> float:
        found = [getattr(r, value) if value in ("rate", "cpu_ms") else r.percentile(float(value))
                 for r in runs[name]]
        return statistics.median(found)

    floor = median("floor", "rate")
    lines = [
        "# `toolfence serve` against a minimal FastAPI endpoint",
        "",
        f"Written by `python -m bench.serve --requests {args.requests} --rounds {args.rounds} "
        f"--workers {args.workers}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, on "
        f"{os.cpu_count()} cores. The same client for every row: {THREADS} threads, each with one "
        f"keep-alive connection, {args.requests} `POST /v1/requests` of one no-op idempotent write per "
        f"round, {args.rounds} interleaved rounds, medians; local PostgreSQL, loopback. Load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (the client runs on the same cores).",
        "",
        "| server | processes | requests/s | p50 ms | p99 ms | server CPU ms/request | ratio to the floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| floor: FastAPI + psycopg, key SELECT, pydantic body, 2 INSERTs + NOTIFY | 1 | {floor:.0f} | "
        f"{median('floor', '0.5') * 1000:.1f} | {median('floor', '0.99') * 1000:.1f} | "
        f"{median('floor', 'cpu_ms'):.2f} | 1.00 × |",
    ]
    for variant in worker_counts:
        name, n = variant.name, variant.workers
        rate = median(name, "rate")
        storage = "Redis" if variant.redis else "memory"
        lines.append(
            f"| `toolfence serve --workers {n}` (limits in {storage}) | {n} | {rate:.0f} | "
            f"{median(name, '0.5') * 1000:.1f} | {median(name, '0.99') * 1000:.1f} | "
            f"{median(name, 'cpu_ms'):.2f} | {rate / floor:.2f} × |"
        )
    errors = {
        name: sum(sum(c for s, c in r.statuses.items() if s >= 300) for r in rs) for name, rs in runs.items()
    }
    lines += [
        "",
        "Rounds (requests/s): " + "; ".join(
            f"{name} " + ", ".join(f"{r.rate:.0f}" for r in rs) for name, rs in runs.items()
        ),
        "",
        "Answers other than 202: " + ", ".join(f"{name} {n}" for name, n in errors.items()) + ".",
        "",
        "How to read it: the client, PostgreSQL, Redis and every server share the same cores, so "
        "requests/s rise and fall with whatever else runs; the server's CPU per request (its "
        "processes' user + system time over the round, divided by the requests) moves far less "
        "with load, and its ratio is the floor's efficiency over toolfence's. With more workers "
        "than spare cores, `--workers N` cannot add throughput: each worker has fewer requests "
        "in flight and the same cores to share.",
        "",
    ]
    lines += [
        "For bench/RESULTS.md (ratios of the medians above; requests/s by worker count):",
        "",
        "| ratio | value |",
        "|---|---|",
    ]
    for variant in worker_counts:
        name, n = variant.name, variant.workers
        where = "Redis" if variant.redis else "memory"
        lines.append(
            f"| `toolfence serve --workers {n}` (limits in {where}) / FastAPI + psycopg floor, same client "
            f"({median(name, 'rate'):.0f} / {floor:.0f} requests/s) | {median(name, 'rate') / floor:.2f} |"
        )
        lines.append(
            f"| `toolfence serve --workers {n}` (limits in {where}): floor's CPU per request / serve's "
            f"({median('floor', 'cpu_ms'):.2f} / {median(name, 'cpu_ms'):.2f} ms) "
            f"| {median('floor', 'cpu_ms') / median(name, 'cpu_ms'):.2f} |"
        )
    lines.append("")
    if profiled:
        lines += ["## Where a request's time goes (`--profile`, py-spy, `toolfence serve --workers 1`)", ""]
        lines += profiled + [""]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
