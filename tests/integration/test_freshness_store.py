"""Freshness on SQLite and PostgreSQL, through the real worker code driven in process:
a read's `observed_at` is the database clock of the statement that completed it
(whatever the worker's own clock says), and a stored result read again later —
by an idempotent replay of its operation id, or by `results()` — says how old it
is on the database clock and is `stale` past its tool's `max_age_seconds`.
"""

from __future__ import annotations

import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine

from executor import store
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    Mode,
    Observed,
    Registry,
    RunContext,
    Tool,
    Written,
)
from executor.core.types import ErrorCode, FailedTerminal, ProposedCall, ServerContext, Succeeded
from executor.settings import Settings
from executor.store.clock import ManualClock
from executor.worker import outcomes as outcomes_module
from executor.worker import runner as runner_module
from executor.worker.outcomes import OutcomeLabel
from executor.worker.runner import OperationRunner
from outbox.producer import enqueue
from outbox.results import operation_status, results

SOURCE_TIME = datetime(2024, 5, 1, 9, 58, tzinfo=UTC)
SHORT_MAX_AGE = 0.5
WORKER_CLOCK_SKEW = 86_400.0


class QuoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    symbol: str


class Quote(BaseModel):
    symbol: str
    price_cents: int


class Handlers:
    """The tools' handlers, counting their invocations."""

    def __init__(self) -> None:
        self.invocations: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.invocations[name] = self.invocations.get(name, 0) + 1

    def quote(self, args: QuoteArgs, ctx: RunContext) -> Observed:
        self._count("quotes.live")
        return Observed(Quote(symbol=args.symbol, price_cents=101), source_time=SOURCE_TIME)

    def cached(self, args: QuoteArgs, ctx: RunContext) -> Quote:
        self._count("quotes.cached")
        return Quote(symbol=args.symbol, price_cents=99)

    def naive(self, args: QuoteArgs, ctx: RunContext) -> Observed:
        self._count("quotes.naive")
        return Observed(Quote(symbol=args.symbol, price_cents=1), source_time=datetime(2024, 5, 1))

    def order(self, args: QuoteArgs, ctx: RunContext) -> Written:
        self._count("orders.place")
        return Written(Quote(symbol=args.symbol, price_cents=101), receipt=f"ord-{ctx.operation_id}")


def registry(handlers: Handlers) -> Registry:
    common: dict[str, Any] = {
        "input_model": QuoteArgs, "output_model": Quote,
        "access": Access.public_tool(), "approval": Approval.never(), "untrusted_output": False,
    }
    return Registry([
        Tool(name="quotes.live", description="a live quote", mode=Mode.READ, run=handlers.quote,
             max_age_seconds=SHORT_MAX_AGE, **common),
        Tool(name="quotes.cached", description="a slow-moving quote", mode=Mode.READ,
             run=handlers.cached, max_age_seconds=3600, **common),
        Tool(name="quotes.naive", description="a source time without a zone", mode=Mode.READ,
             run=handlers.naive, **common),
        Tool(name="orders.place", description="place an order", mode=Mode.WRITE,
             run=handlers.order, effect=[Effect.IDEMPOTENT], **common),
    ])


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def tools(handlers: Handlers) -> Registry:
    return registry(handlers)


@pytest.fixture
def runner(engine: Engine, db_url: str, tools: Registry) -> Iterator[OperationRunner]:
    settings = Settings(database_url=db_url, broker_url="memory://", lease_seconds=10.0)
    yield OperationRunner(settings, tools, engine)


def context(request_id: str) -> ServerContext:
    return ServerContext(principal="alice", tenant="acme", request_id=request_id)


def call(call_id: str, tool_name: str, symbol: str = "ACME") -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool_name, arguments=f'{{"symbol": "{symbol}"}}')


def db_now(engine: Engine) -> float:
    with engine.connect() as conn:
        return store.read_now(conn)


def enqueue_and_run(
    engine: Engine, tools: Registry, runner: OperationRunner, request_id: str,
    calls: list[ProposedCall], operation_ids: dict[str, str] | None = None,
) -> dict[str, str]:
    with engine.begin() as conn:
        handle = enqueue(conn, calls, context(request_id), tools, operation_ids=operation_ids)
    for operation_id in handle.operation_ids.values():
        runner.handle(operation_id)
    return handle.operation_ids


class _SkewedTime(types.ModuleType):
    """The worker's `time` module (its runner's and its outcomes') with its wall clock a day ahead."""

    def __init__(self) -> None:
        super().__init__("time")

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def time() -> float:
        return time.time() + WORKER_CLOCK_SKEW


def test_read__run_by_the_worker__observed_at_is_the_completing_statement_database_clock(
    engine: Engine, tools: Registry, runner: OperationRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker whose own wall clock is a day ahead of the database's
    monkeypatch.setattr(runner_module, "time", _SkewedTime())
    monkeypatch.setattr(outcomes_module, "time", _SkewedTime())
    before = db_now(engine)
    # When it runs a read whose handler gives the source's own timestamp
    operation_id = enqueue_and_run(engine, tools, runner, "req-live", [call("c1", "quotes.live")])["c1"]
    after = db_now(engine)
    [status] = results(engine, "acme", "req-live")
    read_at = db_now(engine)
    # Then observed_at is the database clock of the completion, not the worker's clock
    assert isinstance(status, Succeeded), status
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None
    assert status.observed_at == row.finished_at
    assert status.observed_at is not None and before <= status.observed_at <= after
    # and the source's own time travels beside it, on its own clock
    assert status.source_time == SOURCE_TIME.timestamp()
    assert status.output == {"symbol": "ACME", "price_cents": 101}
    assert status.age_seconds is not None and 0 <= status.age_seconds <= read_at - status.observed_at


def test_read__replayed_past_max_age__stored_result_returned_stale_with_its_age(
    engine: Engine, tools: Registry, runner: OperationRunner, handlers: Handlers
) -> None:
    # Given a live quote (max age 0.5 s) and a cached one (max age 1 h), both run once
    ids = enqueue_and_run(
        engine, tools, runner, "req-first", [call("live", "quotes.live"), call("slow", "quotes.cached")]
    )
    time.sleep(SHORT_MAX_AGE + 0.3)
    # When the application retries the same logical operations (same operation ids)
    before = db_now(engine)
    with engine.begin() as conn:
        replay = enqueue(
            conn, [call("live", "quotes.live"), call("slow", "quotes.cached")],
            context("req-retry"), tools, operation_ids=ids,
        )
    after = db_now(engine)
    # Then nothing ran again, and each stored result says how old it is
    assert handlers.invocations == {"quotes.live": 1, "quotes.cached": 1}
    live, slow = (handle.status for handle in replay.calls)
    assert isinstance(live, Succeeded) and isinstance(slow, Succeeded)
    for status in (live, slow):
        assert status.observed_at is not None and status.age_seconds is not None
        assert before - status.observed_at <= status.age_seconds <= after - status.observed_at
        assert status.age_seconds > SHORT_MAX_AGE
    # and only the one past its tool's max age is stale
    assert (live.stale, slow.stale) == (True, False)
    # The first request's results, read now, say the same
    first_live, first_slow = results(engine, "acme", "req-first")
    assert isinstance(first_live, Succeeded) and isinstance(first_slow, Succeeded)
    assert (first_live.observed_at, first_live.stale) == (live.observed_at, True)
    assert first_live.age_seconds is not None and first_live.age_seconds >= live.age_seconds
    assert first_slow.stale is False


def test_write__run_by_the_worker__receipt_has_observed_at_and_age_and_is_never_stale(
    engine: Engine, tools: Registry, runner: OperationRunner
) -> None:
    operation_id = enqueue_and_run(engine, tools, runner, "req-order", [call("o1", "orders.place")])["o1"]

    [status] = results(engine, "acme", "req-order")

    assert isinstance(status, Succeeded), status
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None and row.receipt == f"ord-{operation_id}"
    assert status.observed_at == row.finished_at
    assert (status.source_time, status.stale) == (None, False)
    assert status.age_seconds is not None and status.age_seconds >= 0


def test_read__naive_source_time__failed_terminal_invalid_result(
    engine: Engine, tools: Registry, runner: OperationRunner
) -> None:
    with engine.begin() as conn:
        handle = enqueue(conn, [call("n1", "quotes.naive")], context("req-naive"), tools)

    outcome = runner.handle(handle.operation_ids["n1"])

    assert outcome.label is OutcomeLabel.FAILED_TERMINAL
    [status] = results(engine, "acme", "req-naive")
    assert isinstance(status, FailedTerminal)
    assert status.error.code is ErrorCode.INVALID_RESULT
    assert "timezone-aware" in status.error.message


def test_complete__manual_clock__observed_at_is_the_clock_and_age_steps_with_it(
    engine: Engine, tools: Registry
) -> None:
    # Given a read completed at a known instant of the store's clock (ahead of the
    # database clock that admitted it, so the reservation is due)
    start = float(round(db_now(engine))) + 1000.0
    clock = ManualClock(start=start)
    tool = tools.get("quotes.cached")
    assert tool is not None
    with engine.begin() as conn:
        handle = enqueue(conn, [call("m1", "quotes.cached")], context("req-manual"), tools)
    operation_id = handle.operation_ids["m1"]
    with engine.begin() as conn:
        reservation = store.reserve(conn, operation_id, "owner-m", 30.0, clock=clock)
        admitted = store.get_operation(conn, operation_id)
    assert reservation is not None and admitted is not None
    clock.advance(2.0)
    with engine.begin() as conn:
        won = store.complete(
            conn, operation_id, reservation.generation, "owner-m", admitted.intent_hash,
            succeeded=True, result=tool.stored_result(Quote(symbol="ACME", price_cents=99)),
            clock=clock,
        )
    assert won
    # When it is read 3600.5 s later on that clock
    clock.advance(3600.5)
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
        status = operation_status("m1", "quotes.cached", row, now=store.read_now(conn, clock))
    # Then its age is exactly that, and it is past its one-hour max age
    assert isinstance(status, Succeeded)
    assert status.observed_at == start + 2.0
    assert status.age_seconds == pytest.approx(3600.5)
    assert status.stale is True
