"""The end-to-end floor: a plain transactional outbox, a SKIP LOCKED relay, a CAS worker.

What an application writing its own outbox would run, on the same PostgreSQL,
Redis and Celery configuration as toolfence (`executor.broker.app.make_celery`),
with the same worker count and pool, fed by the same single producer thread:

- producer (the benchmark process): per request BEGIN; INSERT the operation;
  INSERT its outbox row; NOTIFY; COMMIT (psycopg, no ORM);
- relay (`python -m bench.plain_outbox relay`, one process): claim up to 100 rows
  `FOR UPDATE SKIP LOCKED`, publish each id, mark them published, commit; sleep on
  LISTEN (10 ms poll) when there were none;
- worker (`bench.plain_e2e`, bench/tasks.py): reserve by CAS (queued → started,
  generation + 1, owner), complete by CAS (started → succeeded, same generation
  and owner), stamping `finished_at`.

No admission, no audit rows, no leases, no re-checks: the cost of the shape
alone. Timed like toolfence's end-to-end row: first `created_at` to last
`finished_at`, both on the database clock.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psycopg

TABLES = """
CREATE TABLE IF NOT EXISTS bench_e2e_ops (
    id text PRIMARY KEY, state text NOT NULL, generation integer NOT NULL DEFAULT 0,
    owner text, created_at double precision NOT NULL
        DEFAULT extract(epoch FROM clock_timestamp()),
    finished_at double precision);
CREATE TABLE IF NOT EXISTS bench_e2e_outbox (
    outbox_id bigserial PRIMARY KEY, operation_id text NOT NULL, published_at double precision);
CREATE INDEX IF NOT EXISTS bench_e2e_outbox_unpublished
    ON bench_e2e_outbox (outbox_id) WHERE published_at IS NULL;
"""
CHANNEL = "bench_e2e_outbox"
BATCH = 100
POLL_SECONDS = 0.01


def plain_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_tables(url: str) -> None:
    with psycopg.connect(plain_url(url), autocommit=True) as conn:
        conn.execute(TABLES)


def produce(conn: psycopg.Connection[Any], operation_id: str) -> None:
    """One request: the operation and its outbox row in one transaction, and a NOTIFY."""
    with conn.transaction():
        conn.execute("INSERT INTO bench_e2e_ops (id, state) VALUES (%s, 'queued')", (operation_id,))
        conn.execute("INSERT INTO bench_e2e_outbox (operation_id) VALUES (%s)", (operation_id,))
        conn.execute(f"NOTIFY {CHANNEL}")


def span(conn: psycopg.Connection[Any], prefix: str) -> tuple[list[float], float, int]:
    rows = conn.execute(
        "SELECT created_at, finished_at FROM bench_e2e_ops WHERE id LIKE %s AND state = 'succeeded'",
        (f"{prefix}-%",),
    ).fetchall()
    latencies = [(f - c) * 1000 for c, f in rows]
    return latencies, max(f for _, f in rows) - min(c for c, _ in rows), len(rows)


def relay_forever(url: str) -> None:
    from executor.broker.app import make_celery
    from executor.settings import Settings

    settings = Settings.from_env()
    app = make_celery(settings)
    with app.producer_pool.acquire(block=True) as producer:
        producer.maybe_declare(app.amqp.queues[settings.queue_name])
    listener = psycopg.connect(plain_url(url), autocommit=True)
    listener.execute(f"LISTEN {CHANNEL}")
    conn = psycopg.connect(plain_url(url))
    print("plain relay ready", flush=True)
    while True:
        with conn.transaction():
            rows = conn.execute(
                "SELECT outbox_id, operation_id FROM bench_e2e_outbox WHERE published_at IS NULL "
                "ORDER BY outbox_id LIMIT %s FOR UPDATE SKIP LOCKED",
                (BATCH,),
            ).fetchall()
            for _, operation_id in rows:
                app.send_task("bench.plain_e2e", args=[operation_id], queue=settings.queue_name)
            if rows:
                conn.execute(
                    "UPDATE bench_e2e_outbox SET published_at = extract(epoch FROM clock_timestamp()) "
                    "WHERE outbox_id = ANY(%s)",
                    ([r[0] for r in rows],),
                )
        if len(rows) < BATCH:
            for _ in listener.notifies(timeout=POLL_SECONDS, stop_after=1):
                pass


def wait_done(conn: psycopg.Connection[Any], prefix: str, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = conn.execute(
            "SELECT count(*) FROM bench_e2e_ops WHERE id LIKE %s AND state = 'succeeded'",
            (f"{prefix}-%",),
        ).fetchone()
        if done is not None and done[0] >= n:
            return
        time.sleep(0.02)
    raise TimeoutError(f"plain outbox: not all {n} operations finished")


if __name__ == "__main__":
    if sys.argv[1:] != ["relay"]:
        sys.exit("usage: python -m bench.plain_outbox relay")
    relay_forever(os.environ["TOOLFENCE_DATABASE_URL"])
