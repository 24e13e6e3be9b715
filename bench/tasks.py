"""Celery tasks for the baselines, configured exactly like toolfence's own app.

- `bench.noop`: raw Celery, the least a queue costs (one Redis INCR so the
  benchmark can see it finished).
- `bench.floor`: toolfence's own `reserve` and `complete` (with their audit rows),
  on PostgreSQL.
- `bench.plain_floor`: two single-row UPDATEs on a bare table in plain SQL, reserve
  CAS then complete CAS, no audit rows: the physical floor for "reserve by CAS,
  complete by CAS" with this worker configuration.
- `bench.sleep`: raw Celery with a task that sleeps like the I/O-bound tool.
- `bench.plain_e2e`: the end-to-end floor's worker (bench/plain_outbox.py).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg
import redis
from celery import signals

from executor import store
from executor.broker.app import make_celery
from executor.settings import Settings
from executor.store.engine import dispose_engines, get_engine

settings = Settings.from_env()
app = make_celery(settings)
_redis: Any = None
_plain = threading.local()


def _counter() -> Any:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    return _redis


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    global _redis
    dispose_engines()
    _redis = None
    _plain.__dict__.clear()


@app.task(name="bench.noop", acks_late=True, ignore_result=True)
def noop(run_id: str) -> None:
    _counter().incr(f"bench:{run_id}")


@app.task(name="bench.floor", acks_late=True, ignore_result=True)
def floor(operation_id: str, intent_hash: str) -> None:
    engine = get_engine(settings.database_url)
    owner = f"{os.getpid()}-floor"
    with engine.begin() as conn:
        reservation = store.reserve(conn, operation_id, owner, settings.lease_seconds)
    if reservation is None:
        return
    with engine.begin() as conn:
        store.complete(
            conn, operation_id, reservation.generation, owner, intent_hash,
            succeeded=True, result={"ok": True},
        )


def _plain_connection() -> psycopg.Connection[Any]:
    conn = getattr(_plain, "conn", None)
    if conn is None:
        url = settings.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        conn = _plain.conn = psycopg.connect(url)
    return conn


def _plain_cas_pair(operation_id: str, table: str, finished: str = "") -> None:
    """A plain worker's two CAS UPDATEs on `table`: reserve (generation + 1, owner),
    then complete (fenced on generation and owner), each its own transaction."""
    conn = _plain_connection()
    owner = f"{os.getpid()}-{threading.get_ident()}"
    with conn.transaction():
        row = conn.execute(
            f"UPDATE {table} SET state = 'started', generation = generation + 1, owner = %s "
            "WHERE id = %s AND state = 'queued' RETURNING generation",
            (owner, operation_id),
        ).fetchone()
    if row is None:
        return
    with conn.transaction():
        conn.execute(
            f"UPDATE {table} SET state = 'succeeded', owner = NULL{finished} "
            "WHERE id = %s AND state = 'started' AND generation = %s AND owner = %s",
            (operation_id, row[0], owner),
        )


@app.task(name="bench.plain_floor", acks_late=True, ignore_result=True)
def plain_floor(operation_id: str) -> None:
    _plain_cas_pair(operation_id, "bench_plain")


@app.task(name="bench.sleep", acks_late=True, ignore_result=True)
def sleep(run_id: str, seconds: float) -> None:
    time.sleep(seconds)
    _counter().incr(f"bench:{run_id}")


@app.task(name="bench.plain_e2e", acks_late=True, ignore_result=True)
def plain_e2e(operation_id: str) -> None:
    """The end-to-end floor's worker (bench/plain_outbox.py): reserve CAS, complete CAS."""
    _plain_cas_pair(
        operation_id, "bench_e2e_ops", ", finished_at = extract(epoch FROM clock_timestamp())"
    )
