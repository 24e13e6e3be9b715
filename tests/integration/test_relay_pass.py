"""One relay pass on a real database (SQLite and PostgreSQL): what it publishes, and
in which order it does its two jobs (publish the outbox, promote due retries)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import Engine

from executor import store
from executor.core.types import ErrorCode
from executor.settings import Settings
from executor.store.records import Created, NewOperation
from outbox.relay import Relay
from tests.polling import eventually


def _register(engine: Engine) -> str:
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    new = NewOperation(
        operation_id=f"op-{uuid.uuid4().hex[:10]}", request_id=request_id, call_id="call-0",
        position=0, tool_name="bench.sleep_read", schema_version=1, mode="read", intent_hash="0" * 64,
        arguments={"n": 1}, context={"principal": "p", "tenant": "t", "roles": [], "request_id": request_id},
        needs_approval=False, impact=None, approval_ttl_seconds=3600.0,
    )
    with engine.begin() as conn:
        created = store.register(conn, new)
        assert isinstance(created, Created)
        store.add_outbox_row(conn, created.operation_id)  # as the producer does
    return created.operation_id


def _state(engine: Engine, operation_id: str) -> str | None:
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    return None if row is None else row.state


def _release_to_retry_now(engine: Engine, operation_id: str) -> None:
    """Its worker gave it back: retry_wait, with a backoff that has already passed."""
    with engine.begin() as conn:
        reservation = store.reserve(conn, operation_id, "owner-a", 30.0)
        assert reservation is not None
        assert store.release_to_retry(
            conn, operation_id, reservation.generation, "owner-a", delay_seconds=0.0,
            error_code=ErrorCode.UPSTREAM_UNAVAILABLE, error={"message": "try again"},
        )


def _drained(relay: Relay) -> None:
    while relay.run_once():
        pass


def test_relay_pass__due_retry__promoted_and_published_in_the_same_pass(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    published: list[str] = []
    relay = Relay(Settings.from_env(), engine, published.append)
    operation_id = _register(engine)
    _drained(relay)  # its first message
    _release_to_retry_now(engine, operation_id)
    published.clear()
    with engine.begin() as conn:
        # Due again: the relay's own query decides it, on the database clock.
        assert store.due_retries(conn, 10) == [operation_id]

    # When one pass runs
    count = relay.run_once()

    # Then it promoted the retry and published its message, not at the next pass
    assert (count, published) == (1, [operation_id])
    assert _state(engine, operation_id) == "queued"


def test_relay_pass__a_fresh_row_is_published_before_the_due_retry_query(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a row a producer just committed (a pass is usually woken by its NOTIFY)
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    events: list[str] = []
    relay = Relay(Settings.from_env(), engine, lambda operation_id: events.append(f"publish {operation_id}"))
    operation_id = _register(engine)
    real_due_retries = store.due_retries

    def recording_due_retries(*args: object, **kwargs: object) -> list[str]:
        events.append("due_retries")
        return real_due_retries(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "due_retries", recording_due_retries)

    # When one pass runs
    relay.run_once()

    # Then its message went out first: the retry query is not on its path
    assert events == [f"publish {operation_id}", "due_retries"]


def _publishes_timed() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("toolfence_relay_publish_seconds_count") or 0.0


def test_relay_pass__each_publish__timed_failed_ones_too(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two rows, and a broker that refuses the second publish
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    published: list[str] = []

    def publish(operation_id: str) -> None:
        if published:
            raise ConnectionError("broker gone")
        published.append(operation_id)

    relay = Relay(Settings.from_env(), engine, publish)
    _register(engine)
    _register(engine)
    before = _publishes_timed()

    # When one pass runs
    count = relay.run_once()

    # Then both publishes were timed (the broker's share of the outbox lag), one succeeded
    assert count == 1 and len(published) == 1
    assert _publishes_timed() - before == 2


def test_relay_pass__promote_false__no_due_retry_query(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    published: list[str] = []
    relay = Relay(Settings.from_env(), engine, published.append)
    operation_id = _register(engine)
    _drained(relay)
    _release_to_retry_now(engine, operation_id)
    published.clear()

    # A pass that only publishes (run_forever's, between two poll intervals)
    assert relay.run_once(promote=False) == 0

    # The due retry waits for the next promoting pass, still retry_wait
    assert _state(engine, operation_id) == "retry_wait" and published == []
    assert relay.run_once() == 1 and published == [operation_id]


def test_run_forever__fresh_rows_and_a_due_retry__each_published_within_a_poll_interval(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a running relay polling every 0.3 s (and woken by NOTIFY on PostgreSQL)
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.setenv("TOOLFENCE_RELAY_POLL_SECONDS", "0.3")
    published: list[str] = []
    relay = Relay(Settings.from_env(), engine, published.append)
    stop = threading.Event()
    runner = threading.Thread(target=relay.run_forever, args=(stop,), daemon=True)
    runner.start()
    try:
        # When producers keep committing rows, and one operation is given back, due now
        first = _register(engine)
        assert eventually(lambda: first in published, 5)
        _release_to_retry_now(engine, first)
        others = [_register(engine) for _ in range(5)]

        # Then the fresh rows go out, and the due retry is promoted and republished
        # although the passes in between only published
        assert eventually(lambda: set(others) <= set(published), 5)
        assert eventually(lambda: published.count(first) == 2, 5)
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive()
    assert _state(engine, first) == "queued"


def test_two_relays__same_outbox__each_row_published_once(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 60 fresh rows and two relays draining them at once (PostgreSQL: the claim's
    # SKIP LOCKED on the driver connection; SQLite: writers serialised)
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.setenv("TOOLFENCE_RELAY_BATCH_SIZE", "7")
    ids = [_register(engine) for _ in range(60)]
    published: list[str] = []
    lock = threading.Lock()

    def publish(operation_id: str) -> None:
        time.sleep(0.001)  # a broker round trip, so the two passes overlap
        with lock:
            published.append(operation_id)

    relays = [Relay(Settings.from_env(), engine, publish) for _ in range(2)]
    threads = [threading.Thread(target=_drained, args=(relay,)) for relay in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    # Then every row went out exactly once
    assert sorted(published) == sorted(ids)
