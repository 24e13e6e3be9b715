"""Celery tasks for the baselines, configured exactly like toolfence's own app.

- `bench.noop`: raw Celery, the least a queue costs (one Redis INCR so the
  benchmark can see it finished).
- `bench.floor`: a reserve CAS and a complete CAS on PostgreSQL, the least any
  correct executor pays per operation.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import signals

from executor import store
from executor.settings import Settings
from executor.store.engine import dispose_engines, get_engine
from executor.worker.celery_app import make_celery

settings = Settings.from_env()
app = make_celery(settings)
_redis: Any = None


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
