"""`enqueue` on PostgreSQL: its reads in one round trip, its writes in another.

Counted on the wire: libpq's protocol trace of the producer's own connection,
one `ReadyForQuery` from the server per round trip (every Sync, every simple
query ends with one). The caller's transaction has begun before `enqueue` (its
BEGIN and COMMIT are the caller's, as for any statement of its own), so what is
counted is what admission costs. And the one case the up-front reads cannot
settle for good: an operation id the caller chose, taken by another request
between the reads and the writes (docs/decisions/0212).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from psycopg.pq import Trace
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, Engine, func, select, text

from executor import store
from executor.core.approvers import ApproverPolicy
from executor.core.budgets import BudgetLimits, Budgets
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import ProposedCall, ServerContext
from executor.store.engine import make_engine
from executor.store.schema import calls, operations, outbox
from outbox.producer import AdmissionUnavailable, enqueue


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class Done(BaseModel):
    receipt: str


def _write(args: Note, ctx: RunContext) -> Written:
    return Written(Done(receipt=ctx.idempotency_key), ctx.idempotency_key)


def _read(args: Note, ctx: RunContext) -> Done:
    return Done(receipt="read")


def _tool(name: str, mode: Mode) -> Tool[Note]:
    if mode is Mode.READ:
        return Tool(
            name=name, description=name, mode=mode, untrusted_output=False, input_model=Note,
            output_model=Done, run=_read, access=Access.for_roles("member"), approval=Approval.never(),
        )
    return Tool(
        name=name, description=name, mode=mode, untrusted_output=False, input_model=Note,
        output_model=Done, run=_write, access=Access.for_roles("member"), approval=Approval.never(),
        effect=[Effect.IDEMPOTENT],
    )


REGISTRY = Registry([
    _tool("notes.add", Mode.WRITE),
    _tool("notes.read", Mode.READ),
    Tool(
        name="notes.publish", description="publish", mode=Mode.WRITE, untrusted_output=False,
        input_model=Note, output_model=Done, run=_write, access=Access.for_roles("member"),
        approval=Approval.always(), approvers=ApproverPolicy.for_roles("approver"),
        effect=[Effect.IDEMPOTENT],
    ),
])


def ctx(request_id: str, conversation_id: str | None = None) -> ServerContext:
    return ServerContext(
        principal="alice", tenant="acme", roles=frozenset({"member"}), request_id=request_id,
        conversation_id=conversation_id,
    )


def note(call_id: str, tool: str, words: str) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool, arguments={"text": words})


@contextmanager
def round_trips(conn: Connection) -> Iterator[list[int]]:
    """Count the server's ReadyForQuery messages on this connection inside the block."""
    counted: list[int] = []
    pgconn = conn.connection.driver_connection.pgconn  # type: ignore[union-attr]
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            yield counted
        finally:
            pgconn.untrace()
        trace.seek(0)
        counted.append(sum(1 for line in trace if line.startswith("B\t") and "\tReadyForQuery\t" in line))


def enqueue_counted(engine: Engine, batch: Sequence[ProposedCall], context: ServerContext,
                    budgets: Budgets | None = None) -> tuple[int, list[str]]:
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))  # the caller's transaction has begun (its BEGIN is its own)
        with round_trips(conn) as counted:
            handle = enqueue(conn, batch, context, REGISTRY, budgets=budgets)
    return counted[0], [c.status.status for c in handle.calls]


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    made = make_engine(pg_url)
    yield made
    made.dispose()


def test_one_call__two_round_trips(engine: Engine) -> None:
    trips, statuses = enqueue_counted(engine, [note("c1", "notes.add", "hello")], ctx("r-1"))
    assert statuses == ["pending"]
    assert trips == 2


def test_ten_calls_of_every_kind_in_a_conversation__still_two_round_trips(engine: Engine) -> None:
    # Given an earlier request of the conversation (its write is what a repeat finds)
    enqueue_counted(engine, [note("c0", "notes.add", "first")], ctx("r-0", "conv-1"))
    batch = [
        note("c1", "notes.read", "a"), note("c2", "notes.add", "b"), note("c3", "notes.publish", "c"),
        note("c4", "notes.add", "first"),  # repeats r-0's write: reused, not run again
        note("c5", "notes.unknown", "d"),  # not allowed: refused at the allowlist
        *(note(f"c{i}", "notes.read", str(i)) for i in range(6, 11)),
    ]
    trips, statuses = enqueue_counted(engine, batch, ctx("r-1", "conv-1"))
    assert trips == 2
    assert statuses == [
        "pending", "pending", "pending", "pending", "failed_terminal", *["pending"] * 5,
    ]
    with engine.connect() as conn:
        reused = conn.execute(
            select(calls.c.reused_from_call_id).where(calls.c.request_id == "r-1", calls.c.call_id == "c4")
        ).scalar_one()
        approvals_waiting = conn.execute(
            select(func.count()).select_from(operations).where(operations.c.state == "pending_approval")
        ).scalar_one()
    assert reused == "c0"
    assert approvals_waiting == 1


def test_budget_counts_the_batch_s_own_calls_as_the_table_would(engine: Engine) -> None:
    limits = {"max_calls": 3, "max_writes": 10, "max_calls_per_tool": 10, "max_repeated_failures": 10}
    budgets = Budgets(request=BudgetLimits(**limits), conversation=BudgetLimits(**limits))
    batch = [note(f"c{i}", "notes.read", str(i)) for i in range(5)]
    trips, statuses = enqueue_counted(engine, batch, ctx("r-1"), budgets)
    assert trips == 2
    assert statuses == ["pending", "pending", "pending", "failed_terminal", "failed_terminal"]


def test_a_write_repeated_inside_one_batch__asks_the_database_once_more(engine: Engine) -> None:
    # The reads cannot know a write of the batch itself: its rows are written, then asked
    batch = [note("c1", "notes.add", "same"), note("c2", "notes.add", "same")]
    trips, statuses = enqueue_counted(engine, batch, ctx("r-1"))
    assert statuses == ["pending", "pending"]
    assert trips == 4  # reads, the first write's rows, the earlier-write read, the rest
    with engine.connect() as conn:
        reused = conn.execute(select(calls.c.reused_from_call_id).where(calls.c.call_id == "c2")).scalar_one()
        ops = conn.execute(select(func.count()).select_from(operations)).scalar_one()
    assert (reused, ops) == ("c1", 1)


def test_chosen_operation_id_taken_between_the_reads_and_the_writes__raced_and_nothing_stands(
    pg_url: str,
) -> None:
    other = make_engine(pg_url)
    engine = make_engine(pg_url)
    taken: list[str] = []

    def rule(args: Note, context: ServerContext) -> bool:
        # Runs between the producer's reads and its writes: another request, in its
        # own transaction, registers the id this request chose, and commits.
        if not taken:
            taken.append("op-chosen")
            with other.begin() as conn:
                enqueue(conn, [note("x1", "race.add", "theirs")], ctx("r-other"), race,
                        operation_ids={"x1": "op-chosen"})
        return True

    race = Registry([Tool(
        name="race.add", description="add", mode=Mode.WRITE, untrusted_output=False, input_model=Note,
        output_model=Done, run=_write, access=Access.for_roles("member", rule=rule),
        approval=Approval.never(), effect=[Effect.IDEMPOTENT],
    )])
    try:
        # When this request admits its call under the same chosen id
        with pytest.raises(AdmissionUnavailable) as raised, engine.begin() as conn:
            enqueue(conn, [note("c1", "race.add", "mine")], ctx("r-mine"), race,
                    operation_ids={"c1": "op-chosen"})
        # Then it is refused as raced (roll back, enqueue again), naming no id in its text
        assert isinstance(raised.value, store.AdmissionRaced)
        assert "op-chosen" not in str(raised.value)
        with engine.connect() as conn:
            mine = conn.execute(select(func.count()).select_from(calls).where(calls.c.request_id == "r-mine"))
            assert mine.scalar_one() == 0
            assert conn.execute(select(func.count()).select_from(outbox)).scalar_one() == 1  # theirs
        # And enqueued again, the taken id is a conflict (another intent), recorded once
        with engine.begin() as conn:
            [again] = enqueue(
                conn, [note("c1", "race.add", "mine")], ctx("r-mine"), race, operation_ids={"c1": "op-chosen"}
            ).calls
        assert again.status.status == "failed_terminal"
        assert again.status.error.code == "idempotency_conflict"  # type: ignore[union-attr]
    finally:
        engine.dispose()
        other.dispose()
