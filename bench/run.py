"""`make bench`: toolfence against raw Celery, the CAS floor and DBOS, in one sitting.

Every scenario runs in this one script on the same PostgreSQL and Redis, with the
same number of worker processes (2, prefork, concurrency 1), and is reported as
a ratio against the baselines measured minutes apart. Nothing here is a timed
assertion: the numbers are printed and written to bench/RESULTS.md.

    python -m bench.run [--ops 2000] [--io-ops 5000] [--in-flight 1000] [--repeat 3]
                        [--quick] [--skip-dbos] [--skip-scale] [--skip-rabbitmq]
                        [--only e2e] [--only io] [--write FILE]

`--only` runs just those rows (e2e: the plain outbox floor, toolfence end to end with
the no-op write, DBOS; io: raw Celery and toolfence on the threads pool, a 100 ms
sleep), --repeat interleaved rounds, and prints them with their ratios per round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import Engine, and_, event, func, select, text

from bench import cpu

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
BROKERS = {"redis": REDIS_URL, "rabbitmq": AMQP_URL}
BENCH_TOOLS = "bench.tools:registry"
IO_SLEEP_SECONDS = 0.1
IO_CONCURRENCY = 32
DB_NAME = "toolfence_bench"
DBOS_DB_NAME = "toolfence_bench_dbos"
WORKERS = 2
WARM_UP_CALLS = 10  # through a fresh fleet before a latency row's clock starts


def pg_url(dbname: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1) + f"/{dbname}"


def recreate_database(name: str) -> None:
    """A fresh database, collated "C": the benchmark's completion polls select a row's
    operations by `request_id LIKE 'prefix-%'`, which PostgreSQL answers from the
    index only in a "C" collation. In any other (C.UTF-8 included) each 20 ms poll
    read every benchmark row so far, 27 ms a poll by the last rows of a sitting, and
    the later rows paid for the earlier ones on the very cores they were timed on."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0 ENCODING \'UTF8\' LC_COLLATE \'C\'')


def settle_statistics(engine: Engine) -> None:
    """ANALYZE, as autovacuum would have by now on a live database. A sitting grows its
    tables from empty to tens of thousands of rows in minutes, faster than autovacuum's
    one-minute nap; a statement prepared in the first seconds keeps the plan of a
    near-empty table (a sequential scan for `operation_id = ANY(...)`) until an ANALYZE
    invalidates it, and each request then paid for every row before it (decision 0235).
    Run before a row's clock starts, never inside it."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Result:
    name: str
    operations: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    note: str = ""
    overhead_ms: list[float] = field(default_factory=list)
    cpu: cpu.Window | None = None  # the machine's busy CPU in the timed window, and by whom

    @property
    def per_second(self) -> float:
        return self.operations / self.seconds if self.seconds else float("nan")

    @property
    def cpu_ms_per_op(self) -> float:
        if self.cpu is None or not self.operations:
            return float("nan")
        return self.cpu.busy * 1000 / self.operations

    def cpu_ms_per_op_by_role(self) -> dict[str, float]:
        if self.cpu is None or not self.operations:
            return {}
        return {role: seconds * 1000 / self.operations for role, seconds in self.cpu.by_role.items()}

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 0.99)


# ----------------------------------------------------------------------- processes


@contextmanager
def processes(commands: list[list[str]], env: dict[str, str], ready: str, log_dir: Path) -> Iterator[None]:
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    for i, command in enumerate(commands):
        log = (log_dir / f"proc-{i}.log").open("wb")
        procs.append(
            (subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, cwd=ROOT), log_dir / f"proc-{i}.log")
        )
    try:
        deadline = time.monotonic() + 60
        for proc, log_path in procs:
            if not ready:
                continue
            while ready not in log_path.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    started = " ".join(commands[0])
                    raise RuntimeError(f"{started} failed to start: {log_path.read_text()[-2000:]}")
                time.sleep(0.1)
        yield
    finally:
        for proc, _ in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc, _ in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def celery_workers(
    module: str, env: dict[str, str], log_dir: Path, pool: str = "prefork", concurrency: int = 1
) -> Any:
    commands = [
        [sys.executable, "-m", "celery", "-A", module, "worker", "--concurrency", str(concurrency),
         "-P", pool,
         "-Q", env["TOOLFENCE_QUEUE"], "-n", f"bench{i}-{uuid.uuid4().hex[:6]}@%h", "--loglevel", "INFO",
         "--without-gossip", "--without-mingle", "--without-heartbeat"]
        for i in range(WORKERS)
    ]
    return processes(commands, env, "ready.", log_dir)


def base_env(queue: str, broker: str = "redis") -> dict[str, str]:
    return {
        "TOOLFENCE_DATABASE_URL": pg_url(DB_NAME),
        "TOOLFENCE_BROKER_URL": BROKERS[broker],
        "TOOLFENCE_QUEUE": queue,
        "BENCH_REDIS_URL": REDIS_URL,
        "TOOLFENCE_LEASE_SECONDS": "10",
        "TOOLFENCE_RELAY_POLL_SECONDS": "0.01",
    }


def apply_env(env: dict[str, str]) -> None:
    os.environ.update(env)


# ----------------------------------------------------------------------- baselines


def bench_raw_celery(n: int, log_dir: Path) -> Result:
    queue = f"bench-noop-{uuid.uuid4().hex[:6]}"
    env = base_env(queue)
    apply_env(env)
    run_id = uuid.uuid4().hex
    counter = redis.Redis.from_url(REDIS_URL)
    from bench.tasks import app

    with celery_workers("bench.tasks:app", env, log_dir / "noop"):
        started, window = time.perf_counter(), cpu.Window().start()
        for _ in range(n):
            app.send_task("bench.noop", args=[run_id], queue=queue)
        while int(counter.get(f"bench:{run_id}") or 0) < n:
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        window.stop()
    return Result("raw Celery (no-op task)", n, elapsed, cpu=window)


def register_plain_operations(engine: Engine, n: int, prefix: str) -> list[tuple[str, str]]:
    """n queued operations of a do-nothing shape, registered straight through the store."""
    from executor import store

    ops = []
    with engine.begin() as conn:
        for i in range(n):
            operation_id = f"{prefix}-{i}"
            intent = f"{i:064x}"[-64:]
            store.register(conn, store.NewOperation(
                operation_id=operation_id, request_id=operation_id, call_id="c", position=0,
                tool_name="bench.floor", schema_version=1, mode="write", intent_hash=intent,
                arguments={}, context={}, needs_approval=False, impact=None,
            ))
            ops.append((operation_id, intent))
    return ops


def bench_floor(n: int, engine: Engine, log_dir: Path) -> Result:
    queue = f"bench-floor-{uuid.uuid4().hex[:6]}"
    env = base_env(queue)
    apply_env(env)
    from bench.tasks import app
    from executor.store.schema import operations

    prefix = f"floor-{uuid.uuid4().hex[:6]}"
    ops = register_plain_operations(engine, n, prefix)
    with celery_workers("bench.tasks:app", env, log_dir / "floor"):
        started = time.perf_counter()
        for operation_id, intent in ops:
            app.send_task("bench.floor", args=[operation_id, intent], queue=queue)
        wait_terminal(engine, operations.c.operation_id.like(f"{prefix}-%"), n)
        elapsed = time.perf_counter() - started
    return Result("floor (reserve CAS + complete CAS)", n, elapsed)


POLLS = {"count": 0}


def of_requests(prefix: str) -> Any:
    """The benchmark's operations of requests `prefix-…`. Tenant first: on the index
    (tenant, request_id, position) that is a range of the benchmark's own rows; a
    bare `request_id LIKE` is a sequential scan, which with a million filler rows
    (tenant '') made every 20 ms poll read the whole table and slowed the very
    fleet it was timing."""
    from executor.store.schema import operations

    return and_(operations.c.tenant == "bench", operations.c.request_id.like(f"{prefix}-%"))


def wait_terminal(engine: Engine, condition: Any, n: int, timeout: float = 600) -> None:
    from executor.store.schema import operations

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        POLLS["count"] += 1
        with engine.connect() as conn:
            done = conn.execute(
                select(func.count()).select_from(operations).where(
                    condition, operations.c.state.in_(["succeeded", "failed_terminal"])
                )
            ).scalar_one()
        if done >= n:
            return
        time.sleep(0.02)
    raise TimeoutError(f"only {done} of {n} operations finished")


def bench_dbos(n: int, log_dir: Path) -> Result:
    recreate_database(DBOS_DB_NAME)
    url = pg_url(DBOS_DB_NAME)
    env = {"BENCH_DBOS_URL": url, "BENCH_DBOS_POLL": "0.01", "BENCH_DBOS_CONCURRENCY": "1"}
    commands = [[sys.executable, str(ROOT / "bench" / "dbos_worker.py")] for _ in range(WORKERS)]
    from dbos import DBOSClient

    with processes(commands, env, "dbos worker ready", log_dir / "dbos"):
        client = DBOSClient(system_database_url=url)
        started, window = time.perf_counter(), cpu.Window().start()
        for i in range(n):
            client.enqueue({"queue_name": "bench", "workflow_name": "bench_workflow"}, i)
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            while True:
                done = conn.execute(
                    "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
                ).fetchone()[0]
                if done >= n:
                    break
                time.sleep(0.02)
        elapsed = time.perf_counter() - started
        window.stop()
        client.destroy()
    return Result("DBOS (queued workflow, one step)", n, elapsed, note="polling 10 ms", cpu=window)


# ----------------------------------------------------------------------- toolfence


def ledger_setup(url: str) -> None:
    from ledger.service import Ledger

    book = Ledger(url)
    book.create_schema()
    with book.engine.begin() as conn:
        conn.execute(text("DELETE FROM ledger_accounts"))
    book.open_account("bench-a", "bench", 10**12)
    book.open_account("bench-b", "bench", 0)
    book.engine.dispose()


def transfer_call(i: int) -> Any:
    from executor.core.types import ProposedCall

    return ProposedCall(
        call_id=f"c{i}", tool_name="ledger.transfer",
        arguments=json.dumps({"source_account": "bench-a", "target_account": "bench-b", "amount_cents": 1}),
    )


def enqueue_one(engine: Engine, request_id: str, i: int) -> None:
    from executor.core.types import ServerContext
    from ledger.tools import registry
    from outbox.producer import enqueue

    ctx = ServerContext(principal="bench", tenant="bench", roles=frozenset({"member"}), request_id=request_id)
    with engine.begin() as conn:
        enqueue(conn, [transfer_call(i)], ctx, registry)


@contextmanager
def toolfence_fleet(
    log_dir: Path, *, broker: str = "redis", pool: str = "prefork", concurrency: int = 1,
    relays: int = 1, extra_env: dict[str, str] | None = None,
) -> Iterator[str]:
    from executor.cli.fleet import Fleet

    queue = f"bench-tf-{uuid.uuid4().hex[:6]}"
    env = base_env(queue, broker)
    apply_env(env)
    fleet = Fleet(
        env={**env, "TOOLFENCE_TOOLS": BENCH_TOOLS, "PYTHONPATH": str(ROOT), **(extra_env or {})},
        log_dir=log_dir, workers=WORKERS, concurrency=concurrency, pool=pool,
        reconcile_every=None, relays=relays,
    )
    try:
        fleet.start()
        yield queue
    finally:
        fleet.stop()


def latencies_for(engine: Engine, prefix: str) -> tuple[list[float], float, int]:
    from executor.store.schema import operations

    with engine.connect() as conn:
        rows = conn.execute(
            select(operations.c.created_at, operations.c.finished_at).where(
                of_requests(prefix), operations.c.state == "succeeded"
            )
        ).all()
    lat = [(f - c) * 1000 for c, f in rows]
    span = max(f for _, f in rows) - min(c for c, _ in rows)
    return lat, span, len(rows)


def bench_toolfence_saturation(
    n: int, engine: Engine, log_dir: Path, label: str, broker: str = "redis", *, noop: bool = False,
) -> Result:
    """`n` one-call requests through the whole fleet (producer, relay, workers), timed from
    the first `created_at` to the last `finished_at`: a fenced ledger transfer each, or
    with `noop` the no-op idempotent write the plain outbox floor stands beside."""
    prefix = f"sat-{uuid.uuid4().hex[:6]}"
    settle_statistics(engine)
    with toolfence_fleet(log_dir, broker=broker):
        window = cpu.Window().start()
        if noop:
            enqueue_noop(engine, n, prefix)
        else:
            for i in range(n):
                enqueue_one(engine, f"{prefix}-{i}", i)
        wait_terminal(engine, of_requests(prefix), n)
        window.stop()
    lat, span, count = latencies_for(engine, prefix)
    return Result(label, count, span, lat, note="no-op write" if noop else "fenced ledger write",
                  cpu=window)


def enqueue_noop(engine: Engine, n: int, prefix: str) -> None:
    from bench.tools import registry
    from executor.core.types import ProposedCall, ServerContext
    from outbox.producer import enqueue

    for i in range(n):
        ctx = ServerContext(
            principal="bench", tenant="bench", roles=frozenset({"member"}), request_id=f"{prefix}-{i}"
        )
        with engine.begin() as conn:
            enqueue(conn, [ProposedCall(
                call_id=f"c{i}", tool_name="bench.noop_write", arguments=json.dumps({"n": i}),
            )], ctx, registry)


def bench_plain_outbox(n: int, log_dir: Path) -> Result:
    """The end-to-end floor (bench/plain_outbox.py): the same producer thread, a plain
    outbox and SKIP LOCKED relay, the CAS worker on the same Celery/Redis and pool."""
    from bench import plain_outbox

    queue = f"bench-e2e-{uuid.uuid4().hex[:6]}"
    env = base_env(queue)
    apply_env(env)
    url = pg_url(DB_NAME)
    plain_outbox.create_tables(url)
    prefix = f"e2e-{uuid.uuid4().hex[:6]}"
    relay = processes([[sys.executable, "-m", "bench.plain_outbox", "relay"]], env,
                      "plain relay ready", log_dir / "plain-relay")
    workers = celery_workers("bench.tasks:app", env, log_dir / "plain-e2e")
    with relay, workers, psycopg.connect(plain_outbox.plain_url(url), autocommit=True) as conn:
        conn.execute("ANALYZE")  # as settle_statistics does before toolfence's rows
        window = cpu.Window().start()
        for i in range(n):
            plain_outbox.produce(conn, f"{prefix}-{i}")
        plain_outbox.wait_done(conn, prefix, n)
        window.stop()
        lat, span, count = plain_outbox.span(conn, prefix)
    return Result("plain outbox floor end to end (SKIP LOCKED relay, CAS worker)", count, span, lat,
                  note="no-op", cpu=window)


def bench_toolfence_fixed(rate: float, seconds: float, engine: Engine, log_dir: Path) -> Result:
    prefix = f"fixed-{uuid.uuid4().hex[:6]}"
    n = int(rate * seconds)
    with toolfence_fleet(log_dir):
        # Steady state, not start-up: the first calls through a fresh fleet waited up
        # to 1.3 s, nearly all of it before the relay's first publish (its first broker
        # connection). A few calls through it first, then the clock.
        warm = f"warm-{uuid.uuid4().hex[:6]}"
        for i in range(WARM_UP_CALLS):
            enqueue_one(engine, f"{warm}-{i}", i)
        wait_terminal(engine, of_requests(warm), WARM_UP_CALLS)
        settle_statistics(engine)
        start = time.perf_counter()
        for i in range(n):
            target = start + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            enqueue_one(engine, f"{prefix}-{i}", i)
        wait_terminal(engine, of_requests(prefix), n)
    lat, span, count = latencies_for(engine, prefix)
    durations = tool_durations(engine, prefix)
    overhead = overhead_for(engine, prefix, durations)
    result = Result(f"toolfence end to end, {rate:.0f} ops/s offered", count, span, lat)
    result.overhead_ms = overhead
    return result


def overhead_for(engine: Engine, prefix: str, durations: dict[str, float]) -> list[float]:
    """Enqueue-to-result minus the tool's own time, per operation."""
    from executor.store.schema import operations

    with engine.connect() as conn:
        rows = conn.execute(
            select(operations.c.operation_id, operations.c.created_at, operations.c.finished_at).where(
                of_requests(prefix), operations.c.state == "succeeded"
            )
        ).all()
    return [(f - c) * 1000 - durations.get(o, 0.0) for o, c, f in rows]


def bench_plain_floor(n: int, log_dir: Path) -> Result:
    """Two single-row UPDATEs per operation on a bare table, in plain SQL (bench.plain_floor)."""
    queue = f"bench-plain-{uuid.uuid4().hex[:6]}"
    env = base_env(queue)
    apply_env(env)
    from bench.tasks import app

    prefix = f"plain-{uuid.uuid4().hex[:6]}"
    url = pg_url(DB_NAME).replace("+psycopg", "")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_plain (id text PRIMARY KEY, state text NOT NULL, "
            "generation integer NOT NULL DEFAULT 0, owner text)"
        )
        conn.execute(
            "INSERT INTO bench_plain (id, state) "
            "SELECT %s || '-' || g, 'queued' FROM generate_series(1, %s) g",
            (prefix, n),
        )
    workers = celery_workers("bench.tasks:app", env, log_dir / "plain")
    with workers, psycopg.connect(url, autocommit=True) as conn:
        started, window = time.perf_counter(), cpu.Window().start()
        for i in range(1, n + 1):
            app.send_task("bench.plain_floor", args=[f"{prefix}-{i}"], queue=queue)
        while conn.execute(
            "SELECT count(*) FROM bench_plain WHERE id LIKE %s AND state = 'succeeded'", (f"{prefix}-%",)
        ).fetchone()[0] < n:
            POLLS["count"] += 1
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        window.stop()
    return Result("plain-SQL floor (2 single-row UPDATEs, no audit)", n, elapsed, cpu=window)


def enqueue_calls(engine: Engine, tool: str, n: int, prefix: str) -> list[str]:
    """n one-call requests of `tool`, admitted by the real producer; their operation ids."""
    from bench.tools import registry
    from executor.core.types import ProposedCall, ServerContext
    from outbox.producer import enqueue

    ids = []
    for i in range(n):
        if tool == "ledger.transfer":
            call = transfer_call(i)
        else:
            call = ProposedCall(call_id=f"c{i}", tool_name=tool, arguments=json.dumps({"n": i}))
        ctx = ServerContext(
            principal="bench", tenant="bench", roles=frozenset({"member"}), request_id=f"{prefix}-{i}"
        )
        with engine.begin() as conn:
            handle = enqueue(conn, [call], ctx, registry)
        [admitted] = handle.calls
        assert admitted.operation_id is not None, admitted
        ids.append(admitted.operation_id)
    return ids


def mark_published(engine: Engine, operation_ids: list[str]) -> None:
    """The rows a pre-enqueued scenario publishes itself (straight to the broker, as the
    floors are) leave the outbox as a relay's would. Left unpublished, they were
    published again by the next row that ran a relay: the Redis end-to-end row, which
    ran after the pre-enqueued ones, began with 4,000 duplicate messages queued ahead of
    its own 2,000 (its "p50 10 s"; the RabbitMQ row, after it, found the outbox empty)."""
    from executor.store.schema import outbox

    with engine.begin() as conn:
        for start in range(0, len(operation_ids), 1000):
            conn.execute(
                outbox.update()
                .where(outbox.c.operation_id.in_(operation_ids[start:start + 1000]),
                       outbox.c.published_at.is_(None))
                .values(published_at=func.extract("epoch", func.clock_timestamp()))
            )


def bench_toolfence_direct(
    n: int, tool: str, engine: Engine, log_dir: Path, label: str, *, pool: str = "prefork",
    concurrency: int = 1, broker: str = "redis",
) -> Result:
    """Enqueued before the clock starts, published straight to the broker as the floors are
    (no relay): the worker's path only, apples to apples with the floors."""
    from executor.broker.app import TASK_NAME, make_celery
    from executor.settings import Settings

    prefix = f"pre-{uuid.uuid4().hex[:6]}"
    ids = enqueue_calls(engine, tool, n, prefix)
    mark_published(engine, ids)  # published here, below
    settle_statistics(engine)
    with toolfence_fleet(log_dir, broker=broker, pool=pool, concurrency=concurrency, relays=0) as queue:
        app = make_celery(Settings.from_env())
        started, window = time.perf_counter(), cpu.Window().start()
        for operation_id in ids:
            app.send_task(TASK_NAME, args=[operation_id], queue=queue)
        wait_terminal(engine, of_requests(prefix), n)
        elapsed = time.perf_counter() - started
        window.stop()
    return Result(label, n, elapsed, note=f"{pool} x{concurrency}", cpu=window)


def bench_raw_sleep(n: int, log_dir: Path) -> Result:
    queue = f"bench-sleep-{uuid.uuid4().hex[:6]}"
    env = base_env(queue)
    apply_env(env)
    run_id = uuid.uuid4().hex
    counter = redis.Redis.from_url(REDIS_URL)
    from bench.tasks import app

    workers = celery_workers(
        "bench.tasks:app", env, log_dir / "sleep", pool="threads", concurrency=IO_CONCURRENCY
    )
    with workers:
        started, window = time.perf_counter(), cpu.Window().start()
        for _ in range(n):
            app.send_task("bench.sleep", args=[run_id, IO_SLEEP_SECONDS], queue=queue)
        while int(counter.get(f"bench:{run_id}") or 0) < n:
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        window.stop()
    return Result(f"raw Celery, sleep {IO_SLEEP_SECONDS * 1000:.0f} ms", n, elapsed,
                  note=f"threads x{IO_CONCURRENCY}", cpu=window)


def tool_durations(engine: Engine, prefix: str) -> dict[str, float]:
    """operation id → the tool's own time (the completion's audit `duration_ms`)."""
    from executor.store.schema import audit_events, operations

    with engine.connect() as conn:
        rows = conn.execute(
            select(audit_events.c.operation_id, audit_events.c.duration_ms)
            .join(operations, operations.c.operation_id == audit_events.c.operation_id)
            .where(of_requests(prefix), audit_events.c.to_state == "succeeded")
        ).all()
    return {r.operation_id: float(r.duration_ms or 0.0) for r in rows}


def bench_in_flight(
    total: int, log_dir: Path, engine: Engine, sleep_seconds: float = 12.0
) -> dict[str, float]:
    """`total` long operations in flight at once: lease-renewal statements per second per worker."""
    from prometheus_client import CollectorRegistry

    from executor.broker.app import TASK_NAME, make_celery
    from executor.settings import Settings
    from executor.store.schema import operations
    from executor.telemetry.exporter import MultiprocessTreeCollector

    metrics_dir = log_dir / "inflight-metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for f in metrics_dir.glob("*.db"):
        f.unlink()
    lease = 3.0
    prefix = f"fly-{uuid.uuid4().hex[:6]}"
    ids = enqueue_calls(engine, "bench.sleep_read", total, prefix)
    mark_published(engine, ids)  # published here, below
    per_worker = total // WORKERS

    def renewals() -> float:
        registry = CollectorRegistry()
        registry.register(MultiprocessTreeCollector(str(metrics_dir)))
        value = registry.get_sample_value("toolfence_lease_renewal_statements_total")
        return float(value or 0.0)

    extra = {
        "BENCH_SLEEP_SECONDS": str(sleep_seconds), "TOOLFENCE_LEASE_SECONDS": str(lease),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    with toolfence_fleet(log_dir / "inflight", pool="threads", concurrency=per_worker, relays=0,
                         extra_env=extra) as queue:
        app = make_celery(Settings.from_env())
        for operation_id in ids:
            app.send_task(TASK_NAME, args=[operation_id], queue=queue)
        deadline = time.monotonic() + sleep_seconds
        started = 0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                started = conn.execute(
                    select(func.count()).select_from(operations).where(
                        of_requests(prefix), operations.c.state == "started"
                    )
                ).scalar_one()
            if started >= total:
                break
            time.sleep(0.1)
        window = max(1.0, min(2 * lease, deadline - time.monotonic() - 0.5))
        before = renewals()
        time.sleep(window)
        delta = renewals() - before
        wait_terminal(engine, of_requests(prefix), total, timeout=120)
    return {
        f"in flight at once (of {total})": float(started),
        "lease-renewal statements per second per worker": delta / window / WORKERS,
        "lease-renewal statements per second per worker, one per operation would be": (
            started / (lease / 3) / WORKERS
        ),
    }


# ----------------------------------------------------------------------- commits


def database_counters() -> tuple[int, int]:
    """(transactions committed in the bench database, WAL syncs of the whole cluster)."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DB_NAME,)
        ).fetchone()[0]
        wal_sync = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0]
    return int(commits), int(wal_sync)


@contextmanager
def counted(engine: Engine, into: dict[str, float], label: str, ops: int) -> Iterator[None]:
    """Commits and WAL syncs per operation, from PostgreSQL's own statistics.

    Backends flush their statistics when they exit: the fleet is stopped inside the
    block, and this process's connections are closed before each reading. The
    benchmark's own polls (each a transaction) are subtracted.
    """
    engine.dispose()
    time.sleep(1.0)
    commits0, syncs0 = database_counters()
    polls0 = POLLS["count"]
    yield
    engine.dispose()
    time.sleep(1.5)
    commits1, syncs1 = database_counters()
    commits = commits1 - commits0 - (POLLS["count"] - polls0)
    into[f"{label}: commits/op (pg_stat_database)"] = commits / ops
    into[f"{label}: WAL syncs/op (pg_stat_wal, cluster-wide)"] = (syncs1 - syncs0) / ops


# ----------------------------------------------------------------------- scale


def fill_operations(total: int) -> None:
    """Bring toolfence_operations to `total` rows with terminal history (fast, in SQL)."""
    with psycopg.connect(pg_url(DB_NAME).replace("+psycopg", ""), autocommit=True) as conn:
        have = conn.execute("SELECT count(*) FROM toolfence_operations").fetchone()[0]
        missing = total - have
        if missing <= 0:
            return
        conn.execute(
            """
            INSERT INTO toolfence_operations (operation_id, request_id, call_id, position, tool_name,
                schema_version, mode, state, generation, intent_hash, arguments, context, attempts,
                available_at, created_at, updated_at, finished_at, result)
            SELECT 'fill-' || g || '-' || %s, 'fill-' || g, 'c', 0, 'ledger.transfer', 1, 'write',
                CASE WHEN g %% 10 = 0 THEN 'failed_terminal' ELSE 'succeeded' END, 1,
                md5(g::text) || md5(g::text), '{}', '{}', 1,
                extract(epoch from now()) - g, extract(epoch from now()) - g,
                extract(epoch from now()) - g, extract(epoch from now()) - g + 0.01, '{}'
            FROM generate_series(1, %s) AS g
            """,
            (uuid.uuid4().hex[:6], missing),
        )
        conn.execute("ANALYZE toolfence_operations")


def sweep_time(engine: Engine, stale: int = 10) -> float:
    from executor import store
    from executor.settings import Settings
    from ledger.tools import registry
    from reconciler.sweep import Reconciler

    prefix = f"stale-{uuid.uuid4().hex[:6]}"
    ops = register_plain_operations(engine, stale, prefix)
    with engine.begin() as conn:
        for operation_id, _ in ops:
            store.reserve(conn, operation_id, "dead-owner", -1.0)  # already expired
    reconciler = Reconciler(Settings.from_env(), engine, registry)
    reconciler.sweep()  # warm up plans and connections on other work first
    best = float("inf")
    for _ in range(3):
        with engine.begin() as conn:
            for operation_id, _ in ops:
                conn.execute(text(
                    "UPDATE toolfence_operations SET state='started', lease_expires_at=1, "
                    "owner_token='dead' WHERE operation_id=:o"), {"o": operation_id})
        started = time.perf_counter()
        reconciler.sweep()
        best = min(best, time.perf_counter() - started)
    return best


# ----------------------------------------------------------------------- round trips


def count_round_trips(engine: Engine, n: int = 50) -> dict[str, float]:
    """Statements and commits per operation, counted in-process on the real code paths.

    Counted at the driver (psycopg's cursors, and `executor.store.wire`'s pipelines,
    which send statements without a cursor: decision 0235), not from SQLAlchemy's
    events: the worker's two hot statements run on the driver's connection
    (executor/store/driver.py) and never pass through them. Only the connections
    `engine`'s pool has handed out count (the ledger's hooks and effects use an engine
    of their own), and a statement in autocommit is its own commit (a pipeline in
    autocommit is one implicit transaction: one commit)."""
    from executor.core.tools import load_registry
    from executor.settings import Settings
    from executor.store import wire
    from executor.worker.runner import OperationRunner
    from outbox.relay import Relay

    # `explicit`: COMMITs of a transaction psycopg opened with a BEGIN of its own (each
    # one more round trip than its statements); an autocommit statement is one.
    counts = {"statements": 0, "commits": 0, "explicit": 0}
    real_execute, real_commit = psycopg.Cursor.execute, psycopg.Connection.commit
    checked_out: set[int] = set()  # id() of the driver connections `engine` lent out

    def on_checkout(dbapi_connection: Any, *_: Any) -> None:
        checked_out.add(id(dbapi_connection))

    def on_checkin(dbapi_connection: Any, *_: Any) -> None:
        checked_out.discard(id(dbapi_connection))

    def counting_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if id(self.connection) in checked_out:
            counts["statements"] += 1
            if self.connection.autocommit:
                counts["commits"] += 1
        return real_execute(self, *args, **kwargs)

    def counting_commit(self: Any) -> None:
        in_transaction = self.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        if id(self) in checked_out and in_transaction:
            counts["commits"] += 1
            counts["explicit"] += 1
        real_commit(self)

    def counting_pipeline(driver: Any, statements: Any) -> Any:
        if id(driver) in checked_out:
            counts["statements"] += len(statements)
            if driver.autocommit:
                counts["commits"] += 1
        return real_pipeline(driver, statements)

    real_pipeline = wire.run
    event.listen(engine, "checkout", on_checkout)
    event.listen(engine, "checkin", on_checkin)
    wire.run = counting_pipeline
    psycopg.Cursor.execute = counting_execute  # type: ignore[method-assign]
    psycopg.Connection.commit = counting_commit  # type: ignore[method-assign]
    prefix = f"rt-{uuid.uuid4().hex[:6]}"
    out: dict[str, float] = {}
    try:
        counts.update(statements=0, commits=0, explicit=0)
        for i in range(n):
            enqueue_one(engine, f"{prefix}-{i}", i)
        out["enqueue statements/op"] = counts["statements"] / n
        out["enqueue commits/op"] = counts["commits"] / n
        published: list[str] = []
        relay = Relay(Settings.from_env(), engine, published.append)
        counts.update(statements=0, commits=0, explicit=0)
        while relay.run_once():
            pass
        out["relay statements/op"] = counts["statements"] / max(1, len(published))
        out["relay commits/op"] = counts["commits"] / max(1, len(published))
        settings = Settings.from_env()
        runner = OperationRunner(settings, load_registry("ledger.tools:registry"), engine)  # enqueue_one's
        counts.update(statements=0, commits=0, explicit=0)
        from executor.store.schema import operations

        with engine.connect() as conn:
            ours = set(conn.execute(
                select(operations.c.operation_id).where(of_requests(prefix))
            ).scalars())
        # The relay also published what the pre-enqueued scenarios (no relay) left.
        mine = [p for p in published if p in ours]
        for operation_id in mine:
            runner.handle(operation_id)
        # The ledger uses its own engine; these are toolfence's own round trips.
        out["worker statements/op (toolfence only)"] = counts["statements"] / max(1, len(mine))
        out["worker commits/op (toolfence only)"] = counts["commits"] / max(1, len(mine))
        out["worker round trips/op (statements + BEGIN and COMMIT)"] = (
            counts["statements"] + 2 * counts["explicit"]
        ) / max(1, len(mine))
    finally:
        wire.run = real_pipeline
        psycopg.Cursor.execute = real_execute  # type: ignore[method-assign]
        psycopg.Connection.commit = real_commit  # type: ignore[method-assign]
        event.remove(engine, "checkout", on_checkout)
        event.remove(engine, "checkin", on_checkin)
    return out


# ----------------------------------------------------------------------- report


def machine() -> dict[str, str]:
    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return "?"

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{mem_kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    import celery

    return {
        "cpu": f"{os.cpu_count()} × {cpu}",
        "memory": mem,
        "python": platform.python_version(),
        "celery": celery.__version__,
        "postgresql": run(["psql", "--version"]),
        "redis": run(["redis-server", "--version"]).split(" sha")[0],
    }


def render(
    results: list[Result], ratios: dict[str, float], extras: dict[str, Any],
    rounds: dict[str, list[float]] | None = None,
) -> str:
    lines = [
        "| scenario | ops | seconds | ops/s | p50 ms | p99 ms | machine CPU ms/op | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.operations} | {r.seconds:.2f} | {r.per_second:.1f} | "
            f"{r.p50:.1f} | {r.p99:.1f} | {r.cpu_ms_per_op:.2f} | {r.note} |"
        )
    split = [r for r in results if r.cpu is not None]
    if split:
        lines += [
            "",
            "Machine CPU per operation by process, ms/op (the row's timed window; /proc):",
            "",
            "| scenario | " + " | ".join(cpu.ROLES) + " | all |",
            "|---|" + "---|" * (len(cpu.ROLES) + 1),
        ]
        for r in split:
            by_role = r.cpu_ms_per_op_by_role()
            label = f"{r.name} ({r.note})" if r.note else r.name
            lines.append(
                f"| {label} | " + " | ".join(f"{by_role[role]:.2f}" for role in cpu.ROLES)
                + f" | {r.cpu_ms_per_op:.2f} |"
            )
    if rounds and ratios:
        lines += ["", "Ratios of the first round's rows:"]
    if ratios:
        lines += ["", "| ratio | value |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in ratios.items()]
    if rounds:
        lines += [
            "",
            f"The target ratios, one value per round (each round runs the rows again, "
            f"interleaved), and their median over {len(next(iter(rounds.values())))} rounds:",
            "",
            "| ratio | median | min | max | per round |",
            "|---|---|---|---|---|",
        ]
        for k, values in rounds.items():
            ordered = sorted(values)
            lines.append(
                f"| {k} | {statistics.median(values):.2f} | {ordered[0]:.2f} | {ordered[-1]:.2f} | "
                + ", ".join(f"{v:.2f}" for v in values) + " |"
            )
    lines += ["", "| measure | value |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in extras.items()]
    return "\n".join(lines)


GROUPS = ("e2e", "io")


def fresh_bench_database() -> Engine:
    """The bench database made anew: migrated, the ledger's tables, the setup environment."""
    from executor.store.engine import make_engine
    from executor.store.migrate import migrate

    recreate_database(DB_NAME)
    migrate(pg_url(DB_NAME))
    ledger_setup(pg_url(DB_NAME))
    apply_env(base_env("bench-setup"))
    return make_engine(pg_url(DB_NAME))


def run_groups(args: argparse.Namespace) -> int:
    """`--only`: the chosen rows, interleaved over --repeat rounds, with their ratios per round."""
    n = 200 if args.quick else args.ops
    io_n = 500 if args.quick else args.io_ops
    log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp/toolfence-bench"))
    load_before = os.getloadavg()
    engine = fresh_bench_database()
    results: list[Result] = []
    rounds: dict[str, list[float]] = {}
    for k in range(1, args.repeat + 1):
        def row(result: Result, k: int = k) -> Result:
            result.note = f"{result.note}, round {k}" if result.note else f"round {k}"
            results.append(result)
            print(f"{result.name} ({result.note}): {result.per_second:.1f}/s, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            return result

        if "io" in args.only:
            raw = row(bench_raw_sleep(io_n, log_dir))
            io = row(bench_toolfence_direct(
                io_n, "bench.sleep_read", engine, log_dir / "tf-io",
                f"toolfence read, sleep {IO_SLEEP_SECONDS * 1000:.0f} ms",
                pool="threads", concurrency=IO_CONCURRENCY,
            ))
            rounds.setdefault("I/O-bound: toolfence / raw Celery, same pool", []).append(
                io.per_second / raw.per_second
            )
        if "e2e" in args.only:
            plain = row(bench_plain_outbox(n, log_dir))
            e2e = row(bench_toolfence_saturation(
                n, engine, log_dir / "tf-sat-noop", "toolfence end to end (no-op write), Redis", noop=True,
            ))
            rounds.setdefault("toolfence end to end (no-op) / plain outbox floor", []).append(
                e2e.per_second / plain.per_second
            )
            if not args.skip_dbos:
                dbos = row(bench_dbos(n, log_dir))
                rounds.setdefault("toolfence end to end (no-op) / DBOS", []).append(
                    e2e.per_second / dbos.per_second
                )
    load_after = os.getloadavg()
    table = render(results, {}, {
        "load average before (1, 5, 15 min)": ", ".join(f"{v:.1f}" for v in load_before),
        "load average after (1, 5, 15 min)": ", ".join(f"{v:.1f}" for v in load_after),
    }, rounds)
    print(table)
    if args.write:
        Path(args.write).write_text(table + "\n")
    engine.dispose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--io-ops", type=int, default=5000)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--repeat", type=int, default=3,
        help="rounds of the rows the targets compare (floor, no-op, fenced, DBOS, I/O), interleaved",
    )
    parser.add_argument("--skip-dbos", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--skip-rabbitmq", action="store_true")
    parser.add_argument(
        "--only", choices=sorted(GROUPS), action="append",
        help="run just these rows, --repeat interleaved rounds, and print them (written only "
             "with --write): io = raw Celery sleep + toolfence read (threads x32); e2e = the plain "
             "outbox floor, toolfence end to end (no-op write, Redis) and DBOS",
    )
    parser.add_argument("--write", default=None, help="default bench/RESULTS.md (none with --only)")
    args = parser.parse_args(argv)
    if args.only:
        return run_groups(args)
    args.write = args.write or str(ROOT / "bench" / "RESULTS.md")
    n = 200 if args.quick else args.ops
    if args.quick:
        args.repeat = min(args.repeat, 2)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    io_n = 500 if args.quick else args.io_ops
    in_flight = 200 if args.quick else args.in_flight
    seconds = 5.0 if args.quick else args.seconds
    log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp/toolfence-bench"))
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    engine = fresh_bench_database()

    results: list[Result] = []
    extras: dict[str, Any] = {}

    def row(result: Result) -> Result:
        results.append(result)
        print(f"{result.name}: {result.per_second:.1f}/s", flush=True)
        return result

    # The rows the targets compare: run once here, and again in each later round.
    def plain_row() -> Result:
        return bench_plain_floor(n, log_dir)

    def noop_write_row() -> Result:
        return bench_toolfence_direct(
            n, "bench.noop_write", engine, log_dir / "tf-noop",
            "toolfence no-op idempotent write, pre-enqueued",
        )

    def fenced_row() -> Result:
        return bench_toolfence_direct(
            n, "ledger.transfer", engine, log_dir / "tf-fenced",
            "toolfence fenced ledger write, pre-enqueued",
        )

    def raw_sleep_row() -> Result:
        return bench_raw_sleep(io_n, log_dir)

    def io_row() -> Result:
        return bench_toolfence_direct(
            io_n, "bench.sleep_read", engine, log_dir / "tf-io",
            f"toolfence read, sleep {IO_SLEEP_SECONDS * 1000:.0f} ms",
            pool="threads", concurrency=IO_CONCURRENCY,
        )

    def plain_e2e_row() -> Result:
        return bench_plain_outbox(n, log_dir)

    def e2e_noop_row() -> Result:
        return bench_toolfence_saturation(
            n, engine, log_dir / "tf-sat-noop", "toolfence end to end (no-op write), Redis", noop=True,
        )

    noop = row(bench_raw_celery(n, log_dir))
    with counted(engine, extras, "plain-SQL floor", n):
        plain = row(plain_row())
    floor = row(bench_floor(n, engine, log_dir))
    with counted(engine, extras, "toolfence no-op write, pre-enqueued", n):
        noop_write = row(noop_write_row())
    with counted(engine, extras, "toolfence fenced ledger write, pre-enqueued", n):
        fenced = row(fenced_row())
    with counted(engine, extras, "toolfence end to end", n):
        sat = row(bench_toolfence_saturation(n, engine, log_dir / "tf-sat", "toolfence end to end, Redis"))
    plain_e2e = row(plain_e2e_row())
    e2e_noop = row(e2e_noop_row())
    sat_amqp: Result | None = None
    if not args.skip_rabbitmq:
        sat_amqp = row(bench_toolfence_saturation(
            n, engine, log_dir / "tf-sat-amqp", "toolfence end to end, RabbitMQ", broker="rabbitmq",
        ))
    rate = max(1.0, round(0.1 * sat.per_second, 1))
    fixed = row(bench_toolfence_fixed(rate, seconds, engine, log_dir / "tf-fixed"))
    fixed.note = f"10 % of {sat.per_second:.0f} ops/s"
    dbos: Result | None = None
    if not args.skip_dbos:
        dbos = row(bench_dbos(n, log_dir))
    raw_sleep = row(raw_sleep_row())
    io = row(io_row())
    ideal = WORKERS * IO_CONCURRENCY / IO_SLEEP_SECONDS
    rounds: dict[str, list[float]] = {}

    def target_ratios(plain: Result, noop_write: Result, fenced: Result, dbos: Result | None,
                      raw_sleep: Result, io: Result, plain_e2e: Result, e2e_noop: Result) -> None:
        values = {
            "toolfence no-op write (pre-enqueued) / plain-SQL floor": (
                noop_write.per_second / plain.per_second
            ),
            "I/O-bound: toolfence / raw Celery, same pool": io.per_second / raw_sleep.per_second,
            f"I/O-bound: toolfence / ideal ({ideal:.0f} ops/s)": io.per_second / ideal,
            "toolfence end to end (no-op) / plain outbox floor": (
                e2e_noop.per_second / plain_e2e.per_second
            ),
        }
        if dbos is not None:
            values["toolfence fenced write (pre-enqueued) / DBOS"] = fenced.per_second / dbos.per_second
            values["toolfence end to end (no-op) / DBOS"] = e2e_noop.per_second / dbos.per_second
        for k, v in values.items():
            rounds.setdefault(k, []).append(v)

    target_ratios(plain, noop_write, fenced, dbos, raw_sleep, io, plain_e2e, e2e_noop)
    for k in range(2, args.repeat + 1):
        # The rows the targets compare, again: one sitting's noise is ±25-30 % on this
        # kind of machine, so one round's ratio alone says little.
        def again(result: Result, k: int = k) -> Result:
            result.note = f"{result.note}, round {k}" if result.note else f"round {k}"
            return row(result)

        target_ratios(
            again(plain_row()), again(noop_write_row()), again(fenced_row()),
            None if args.skip_dbos else again(bench_dbos(n, log_dir)),
            again(raw_sleep_row()), again(io_row()), again(plain_e2e_row()), again(e2e_noop_row()),
        )
    extras.update(bench_in_flight(in_flight, log_dir, engine))

    ratios = {
        "toolfence no-op write (pre-enqueued) / plain-SQL floor": noop_write.per_second / plain.per_second,
        "toolfence fenced write (pre-enqueued) / plain-SQL floor": fenced.per_second / plain.per_second,
        "toolfence end to end / plain-SQL floor": sat.per_second / plain.per_second,
        "toolfence floor (reserve+complete) / plain-SQL floor": floor.per_second / plain.per_second,
        "toolfence end to end / raw Celery": sat.per_second / noop.per_second,
        "I/O-bound: toolfence / raw Celery, same pool": io.per_second / raw_sleep.per_second,
        f"I/O-bound: toolfence / ideal ({ideal:.0f} ops/s)": io.per_second / ideal,
    }
    if dbos:
        ratios["toolfence fenced write (pre-enqueued) / DBOS"] = fenced.per_second / dbos.per_second
        ratios["toolfence end to end / DBOS"] = sat.per_second / dbos.per_second
        ratios["toolfence end to end (no-op) / DBOS"] = e2e_noop.per_second / dbos.per_second
    ratios["toolfence end to end (no-op) / plain outbox floor"] = e2e_noop.per_second / plain_e2e.per_second
    if sat_amqp:
        ratios["toolfence end to end, RabbitMQ / Redis"] = sat_amqp.per_second / sat.per_second
    for q in (0.5, 0.99):
        extras[f"latency at 10 % of capacity: overhead above the tool, p{q * 100:.0f} (ms)"] = (
            percentile(fixed.overhead_ms, q)
        )
    extras.update(count_round_trips(engine))
    if not args.skip_scale:
        small, large = (2_000, 50_000) if args.quick else (10_000, 1_000_000)
        fill_operations(small)
        sweep_small = sweep_time(engine)
        scale_small = row(bench_toolfence_saturation(
            n // 2, engine, log_dir / "tf-small", f"toolfence at {small:,} rows"
        ))
        fill_operations(large)
        sweep_large = sweep_time(engine)
        scale_large = row(bench_toolfence_saturation(
            n // 2, engine, log_dir / "tf-large", f"toolfence at {large:,} rows"
        ))
        ratios[f"throughput at {large:,} / at {small:,} rows"] = (
            scale_large.per_second / scale_small.per_second
        )
        extras[f"reconciler sweep, 10 stale in {small:,} rows (ms)"] = sweep_small * 1000
        extras[f"reconciler sweep, 10 stale in {large:,} rows (ms)"] = sweep_large * 1000
        ratios[f"sweep time {large:,} / {small:,} rows"] = sweep_large / sweep_small
    load_after = os.getloadavg()[0]
    table = render(results, ratios, extras, rounds if args.repeat > 1 else None)
    print(table)
    info = machine()
    report = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (`python -m bench.run`), {began}. One script, one sitting, "
        "same PostgreSQL, Redis and RabbitMQ;",
        f"{WORKERS} worker processes for every queue-based scenario (prefork, concurrency 1, unless the "
        "note says threads).",
        "",
        "Machine: " + "; ".join(f"{k}: {v}" for k, v in info.items())
        + f"; load average {load_before:.1f} before, {load_after:.1f} after",
        "",
        table,
        "",
    ]
    if not args.quick:
        Path(args.write).write_text("\n".join(report))
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
