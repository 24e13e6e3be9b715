"""Pooled PostgreSQL connections are pinged only after they sat idle
(`TOOLFENCE_DB_PING_IDLE_SECONDS`), against a real server whose sessions are
really terminated (`pg_terminate_backend`).

A ping at every checkout costs a round trip; a worker checks out twice per
operation. What the threshold gives up is only this: a session killed less than
the threshold after its connection was last used fails its next statement with
a disconnect error instead of being replaced silently, and the pool is
invalidated so that the statement after it works. Every caller already handles
that error (a session can be killed between a ping and the statement after it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from executor import store
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import ServerContext
from executor.settings import Settings
from executor.store.engine import (
    PING_IDLE_ENV,
    DatabaseSettingError,
    make_engine,
    ping_idle_seconds,
)
from executor.worker.outcomes import OutcomeLabel
from executor.worker.runner import OperationRunner
from tests.netkit import terminate_backend

IDLE = 0.3  # seconds: the short threshold, for the cases that wait past it
# The long one, for the cases that must stay within it: however slow the machine
# between two checkouts, never a reason for a ping the test does not expect.
WITHIN = 60.0


def _terminate(engine: Engine) -> int:
    """Kill the session of the connection the pool hands out next; its backend pid."""
    pid = _backend_pid(engine)
    terminate_backend(pid)
    return pid


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _engine_with(monkeypatch: pytest.MonkeyPatch, pg_url: str, threshold: float) -> Engine:
    monkeypatch.setenv(PING_IDLE_ENV, str(threshold))
    return make_engine(pg_url, pool_size=1, max_overflow=0)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> Iterator[Engine]:
    """A one-connection pool that pings after IDLE seconds."""
    eng = _engine_with(monkeypatch, pg_url, IDLE)
    yield eng
    eng.dispose()


@pytest.fixture
def busy_engine(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> Iterator[Engine]:
    """A one-connection pool whose connection is never idle long enough for a ping."""
    eng = _engine_with(monkeypatch, pg_url, WITHIN)
    yield eng
    eng.dispose()


def _counting_pings(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    pings: list[object] = []
    real_ping = engine.dialect.do_ping

    def counting_ping(dbapi_connection: object) -> bool:
        pings.append(dbapi_connection)
        return bool(real_ping(dbapi_connection))

    monkeypatch.setattr(engine.dialect, "do_ping", counting_ping)
    return pings


def test_connection_idle_past_the_threshold__killed_session__replaced_before_use(engine: Engine) -> None:
    killed = _terminate(engine)
    # When the connection has sat in the pool longer than the threshold
    time.sleep(IDLE + 0.1)

    # Then the checkout pings it, finds it dead and hands out a new one: no error
    assert _backend_pid(engine) != killed


def test_connection_used_within_the_threshold__killed_session__one_disconnect_error_then_a_new_connection(
    busy_engine: Engine,
) -> None:
    killed = _terminate(busy_engine)

    # When it is checked out again within the threshold (no ping): its statement
    # fails as a disconnect
    with pytest.raises(OperationalError) as failure, busy_engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    assert failure.value.connection_invalidated

    # Then the pool was invalidated: the next checkout is a new session
    assert _backend_pid(busy_engine) != killed


def test_busy_connection__never_pinged(busy_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    pings = _counting_pings(busy_engine, monkeypatch)
    # When a connection is checked out again and again within the threshold
    for _ in range(20):
        with busy_engine.connect() as conn:
            conn.execute(text("SELECT 42"))
    # Then it is never pinged
    assert pings == []


def test_idle_connection__pinged_at_its_next_checkout(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 42"))
    pings = _counting_pings(engine, monkeypatch)
    # When the connection has sat idle past the threshold
    time.sleep(IDLE + 0.1)
    with engine.connect() as conn:
        conn.execute(text("SELECT 42"))
    # Then that checkout pinged it, once
    assert len(pings) == 1


def test_zero__every_checkout_pinged(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> None:
    monkeypatch.setenv(PING_IDLE_ENV, "0")
    eng = make_engine(pg_url, pool_size=1, max_overflow=0)
    try:
        killed = _terminate(eng)
        # At once, and still no error: SQLAlchemy's pool_pre_ping replaced it
        assert _backend_pid(eng) != killed
    finally:
        eng.dispose()


@pytest.mark.parametrize("raw", ["-1", "abc", "inf", "nan", ""])
def test_bad_threshold__clear_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(PING_IDLE_ENV, raw)
    with pytest.raises(DatabaseSettingError, match=PING_IDLE_ENV):
        ping_idle_seconds()


def test_default_threshold_is_one_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PING_IDLE_ENV, raising=False)
    assert ping_idle_seconds() == 1.0


# ------------------------------------------------------------------ the worker on such a pool


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Answer(BaseModel):
    value: int


@pytest.mark.parametrize("write", [False, True], ids=["read", "idempotent-write"])
def test_worker__its_session_killed_just_before_a_message__reserves_on_a_new_connection(
    busy_engine: Engine, write: bool
) -> None:
    engine = busy_engine
    runs: list[str] = []

    def run(args: NoArgs, ctx: RunContext) -> Any:
        runs.append(ctx.operation_id)
        return Written(Answer(value=1), f"r-{ctx.operation_id}") if write else Answer(value=1)

    tool = Tool(
        name="probe.answer", description="answers 1", mode=Mode.WRITE if write else Mode.READ,
        untrusted_output=False, input_model=NoArgs, output_model=Answer, run=run,
        access=Access.public_tool(), approval=Approval.never(),
        **({"effect": [Effect.IDEMPOTENT]} if write else {}),
    )
    runner = OperationRunner(
        Settings(database_url=str(engine.url), broker_url="memory://", lease_seconds=30.0),
        Registry([tool]), engine,
    )
    first, second = (_register(engine, tool) for _ in range(2))
    assert runner.handle(first).label is OutcomeLabel.SUCCEEDED
    # Given the worker's one pooled connection, just used, whose session is then killed
    _terminate(engine)

    # When the next message arrives at once (no ping: the reservation's statement fails)
    outcome = runner.handle(second)

    # Then the reservation is made on a new connection and the call runs, once
    assert outcome.label is OutcomeLabel.SUCCEEDED
    assert runs == [first, second]
    with engine.connect() as conn:
        row = store.get_operation(conn, second)
    assert row is not None and (row.state, row.generation) == ("succeeded", 1)


def _register(engine: Engine, tool: Tool[Any]) -> str:
    operation_id = f"op-{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        store.register(
            conn,
            store.NewOperation(
                operation_id=operation_id, request_id=f"req-{operation_id}", call_id="c0",
                position=0, tool_name=tool.name, schema_version=1, mode=tool.mode.value,
                intent_hash=uuid.uuid4().hex, arguments={}, context=CONTEXT.to_json(),
                needs_approval=False, impact=None,
            ),
        )
    return operation_id


CONTEXT = ServerContext(principal="p", tenant="t", roles=frozenset(), request_id="r")
