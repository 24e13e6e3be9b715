"""The heartbeat's local deadline never outlives the lease on the database clock.

The lease is set by the reserve statement on the database clock; the worker's
local deadline must be counted from before that statement was sent, however long
it took afterwards to start the heartbeat (an ambiguous commit's recovery sleeps
up to ~2 s). Each test runs on SQLite and PostgreSQL with the real clock: the
point is the relation between two real clocks, so a `ManualClock` would prove
nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from executor import store
from executor.core.tools import Access, Approval, Mode, Registry, RunContext, Tool
from executor.core.types import ServerContext
from executor.settings import Settings
from executor.worker.heartbeat import Heartbeat
from executor.worker.outcomes import OutcomeLabel
from executor.worker.runner import OperationRunner

LEASE = 3.0
CONTEXT = ServerContext(principal="alice", tenant="acme", request_id="req-heartbeat")


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoOutput(BaseModel):
    pass


def register_read(engine: Engine, tool_name: str) -> str:
    operation_id = f"op-{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        store.register(
            conn,
            store.NewOperation(
                operation_id=operation_id,
                request_id=CONTEXT.request_id,
                call_id="call-0",
                position=0,
                tool_name=tool_name,
                schema_version=1,
                mode=Mode.READ.value,
                intent_hash=uuid.uuid4().hex,
                arguments={},
                context=CONTEXT.to_json(),
                needs_approval=False,
                impact=None,
            ),
        )
    return operation_id


def lease_remaining(engine: Engine, operation_id: str) -> float:
    with engine.connect() as conn:
        remaining = store.lease_remaining(conn, operation_id)
    assert remaining is not None, "the operation is no longer started"
    return float(remaining)


def wait_until_not_owned(owned: Callable[[], bool], timeout: float) -> bool:
    """Poll as a tool would before each downstream write; True once ownership is gone."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if not owned():
            return True
        time.sleep(0.01)
    return False


def test_heartbeat__started_long_after_reserve__not_owned_before_database_lease_expires(
    engine: Engine,
) -> None:
    # Given an operation reserved with a lease on the database clock
    operation_id = register_read(engine, "probe.read")
    reserve_sent_at = time.monotonic()
    with engine.begin() as conn:
        reservation = store.reserve(conn, operation_id, store.new_owner_token(), LEASE)
    assert reservation is not None
    # When the heartbeat is created a third of the lease later (more than the 10%
    # margin), and no renewal has happened yet
    time.sleep(LEASE / 3)
    heartbeat = Heartbeat(engine, reservation, LEASE, reserve_sent_at=reserve_sent_at)
    assert heartbeat.owned()
    # Then ownership ends while the database still holds the lease
    assert wait_until_not_owned(heartbeat.owned, timeout=2 * LEASE)
    assert lease_remaining(engine, operation_id) > 0


def test_runner__reserve_recovered_after_slow_reads__tool_loses_ownership_before_lease_expires(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a read tool that, like a careful tool, checks ownership before each write
    # and notes how much of the database lease is left when it is told to stop
    remaining_when_stopped: list[float] = []

    def run(args: NoArgs, ctx: RunContext) -> NoOutput:
        if wait_until_not_owned(ctx.still_owner, timeout=3 * LEASE):
            remaining_when_stopped.append(lease_remaining(engine, ctx.operation_id))
        ctx.ensure_owner()
        return NoOutput()

    tool = Tool(
        name="probe.read", description="waits until it no longer owns its operation",
        mode=Mode.READ, untrusted_output=False, input_model=NoArgs, output_model=NoOutput, run=run,
        access=Access.public_tool(), approval=Approval.never(),
    )
    operation_id = register_read(engine, tool.name)
    # and a reserve whose commit is reported as a connection error, after which the
    # first four reads of the row fail: the recovery path sleeps 0.2+0.4+0.6+0.8 s
    settings = Settings(
        database_url=db_url, broker_url="memory://", lease_seconds=LEASE,
        fault_points=frozenset({"reserve_commit=ambiguous"}),
    )
    runner = OperationRunner(settings, Registry([tool]), engine)
    reads = {"count": 0}
    real_get_operation = store.get_operation

    def flaky_get_operation(conn: Any, wanted: str) -> store.OperationRow | None:
        reads["count"] += 1
        if reads["count"] <= 4:  # a first delivery is reserved without a read before it
            raise OperationalError("SELECT", {}, Exception("connection reset"))
        return real_get_operation(conn, wanted)

    monkeypatch.setattr(store, "get_operation", flaky_get_operation)
    # When the runner handles the message
    outcome = runner.handle(operation_id)
    # Then the reservation was recovered, and the tool was stopped while the lease was
    # still held on the database clock, not after it expired
    assert reads["count"] == 5
    assert outcome.label is OutcomeLabel.LOST_OWNERSHIP
    assert len(remaining_when_stopped) == 1, "the tool was never told it lost ownership"
    assert remaining_when_stopped[0] > 0
