"""The producer on SQLite and PostgreSQL: re-enqueueing is idempotent, request ids are
scoped by tenant, repeated writes are reused, and budgets refuse before anything runs.

No fleet here: an operation is moved through its states with the store's own
statements where a test needs it terminal.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from notekit import NoteArgs, Out, read_note
from sqlalchemy import Engine, func, select

from executor import store
from executor.core.budgets import BudgetLimits, Budgets, ToolBudget
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import (
    ErrorCode,
    FailedTerminal,
    Pending,
    ProposedCall,
    ServerContext,
    Succeeded,
)
from executor.store.engine import make_engine
from executor.store.schema import calls as calls_table
from executor.store.schema import operations, outbox
from outbox.producer import EnqueueHandle, default_operation_id, enqueue
from outbox.results import results


def _write(args: NoteArgs, ctx: RunContext) -> Written:
    return Written(Out(text=args.text), receipt=f"r-{ctx.operation_id}")


def _tool(name: str, mode: Mode, **extra: Any) -> Tool[NoteArgs]:
    return Tool(
        name=name, description=name, mode=mode, input_model=NoteArgs, output_model=Out,
        run=_write if mode is Mode.WRITE else read_note, access=Access.public_tool(), untrusted_output=False,
        approval=Approval.never(), **({"effect": [Effect.IDEMPOTENT]} if mode is Mode.WRITE else {}),
        **extra,
    )


REGISTRY = Registry([
    _tool("notes.read", Mode.READ),
    _tool("notes.write", Mode.WRITE),
    _tool("notes.pay", Mode.WRITE, repeatable=True),
    _tool("notes.ping", Mode.READ, budget=ToolBudget(per_request=2, per_conversation=3)),
])


def ctx(request_id: str, *, tenant: str = "acme", principal: str = "alice",
        conversation_id: str | None = None) -> ServerContext:
    return ServerContext(principal=principal, tenant=tenant, roles=frozenset({"member"}),
                         request_id=request_id, conversation_id=conversation_id)


def call(call_id: str, tool: str, text: str) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool, arguments=f'{{"text": "{text}"}}')


def run_enqueue(engine: Engine, calls: Sequence[ProposedCall], context: ServerContext,
                **kwargs: Any) -> EnqueueHandle:
    with engine.begin() as conn:
        return enqueue(conn, calls, context, REGISTRY, **kwargs)


def counts(engine: Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (operations, outbox, calls_table)
        )


def fail_terminally(engine: Engine, operation_id: str) -> None:
    """Run the operation's lifecycle by hand to `failed_terminal` (as a worker would)."""
    with engine.begin() as conn:
        row = store.get_operation(conn, operation_id)
        assert row is not None
        reservation = store.reserve(conn, operation_id, "test-owner", 30.0)
        assert reservation is not None
        assert store.complete(
            conn, operation_id, reservation.generation, "test-owner", row.intent_hash,
            succeeded=False, error_code=ErrorCode.EXECUTION_FAILED, error={"message": "boom"},
        )


def succeed(engine: Engine, operation_id: str) -> None:
    with engine.begin() as conn:
        row = store.get_operation(conn, operation_id)
        assert row is not None
        reservation = store.reserve(conn, operation_id, "test-owner", 30.0)
        assert reservation is not None
        assert store.complete(
            conn, operation_id, reservation.generation, "test-owner", row.intent_hash,
            succeeded=True, result={"output": {"text": "done"}, "model_view": {"text": "done"}},
            receipt="r-1",
        )


# ------------------------------------------------------------------ 7: re-enqueue


def test_enqueue_again__same_request_same_calls__same_operations_and_nothing_new(engine: Engine) -> None:
    batch = [call("c1", "notes.read", "a"), call("c2", "notes.write", "b"), call("c3", "nope", "x")]
    first = run_enqueue(engine, batch, ctx("req-1"))
    before = counts(engine)

    second = run_enqueue(engine, batch, ctx("req-1"))

    assert counts(engine) == before  # no operation, outbox row or call row added
    assert second.operation_ids == first.operation_ids
    assert [c.status for c in second.calls] == [c.status for c in first.calls]
    assert results(engine, ctx("req-1")) == [c.status for c in second.calls]


def test_enqueue_again__after_the_write_succeeded__stored_result_not_run_again(engine: Engine) -> None:
    first = run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-1"))
    succeed(engine, first.operation_ids["c1"])
    before = counts(engine)

    [again] = run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-1")).calls

    assert isinstance(again.status, Succeeded) and again.status.output == {"text": "done"}
    assert again.operation_id == first.operation_ids["c1"]
    assert counts(engine) == before


def test_enqueue_again__different_call_under_a_recorded_id__idempotency_conflict_per_call(
    engine: Engine,
) -> None:
    run_enqueue(engine, [call("c1", "notes.write", "b"), call("c2", "notes.read", "a")], ctx("req-1"))
    before = counts(engine)

    handle = run_enqueue(
        engine, [call("c1", "notes.write", "CHANGED"), call("c2", "notes.read", "a")], ctx("req-1")
    )

    conflict, same = handle.calls
    assert isinstance(conflict.status, FailedTerminal)
    assert conflict.status.error.code is ErrorCode.IDEMPOTENCY_CONFLICT
    assert "CHANGED" not in conflict.status.model_dump_json()
    assert isinstance(same.status, Pending)
    assert counts(engine) == before
    # The recorded call keeps its own status.
    assert isinstance(results(engine, ctx("req-1"))[0], Pending)


def test_enqueue_again__another_principal_same_request__conflict(engine: Engine) -> None:
    run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-1"))

    [again] = run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-1", principal="mallory")).calls

    assert isinstance(again.status, FailedTerminal)
    assert again.status.error.code is ErrorCode.IDEMPOTENCY_CONFLICT


def test_enqueue_again__new_call_ids__admitted_after_the_recorded_ones(engine: Engine) -> None:
    run_enqueue(engine, [call("c1", "notes.read", "a")], ctx("req-1"))

    run_enqueue(engine, [call("c1", "notes.read", "a"), call("c2", "notes.read", "z")], ctx("req-1"))

    assert [s.call_id for s in results(engine, ctx("req-1"))] == ["c1", "c2"]


def test_enqueue__two_producers_race_on_one_request__one_admits_the_other_reads_it(pg_url: str) -> None:
    engine = make_engine(pg_url)
    try:
        batch = [call("c1", "notes.write", "b")]
        handles: list[EnqueueHandle] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def producer() -> None:
            try:
                barrier.wait()
                handles.append(run_enqueue(engine, batch, ctx("req-race")))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=producer) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

        assert not errors
        assert {h.operation_ids["c1"] for h in handles} == {default_operation_id("acme", "req-race", "c1")}
        assert counts(engine)[0] == 1
    finally:
        engine.dispose()


# ------------------------------------------------------------------ 7: tenants


def test_two_tenants__same_request_id__independent_operations_and_results(engine: Engine) -> None:
    acme = run_enqueue(engine, [call("c1", "notes.write", "acme")], ctx("req-1", tenant="acme"))
    globex = run_enqueue(engine, [call("c1", "notes.write", "globex")], ctx("req-1", tenant="globex"))

    assert acme.operation_ids["c1"] != globex.operation_ids["c1"]
    assert acme.operation_ids["c1"] == default_operation_id("acme", "req-1", "c1")
    [acme_status] = results(engine, "acme", "req-1")
    [globex_status] = results(engine, ctx("req-1", tenant="globex"))
    assert acme_status.operation_id == acme.operation_ids["c1"]
    assert globex_status.operation_id == globex.operation_ids["c1"]
    assert results(engine, "initech", "req-1") == []


def test_two_tenants__same_request_id__proposal_order_does_not_mix(engine: Engine) -> None:
    run_enqueue(engine, [call("c1", "notes.write", "acme")], ctx("req-1", tenant="acme"))
    globex = run_enqueue(engine, [call("c1", "notes.write", "globex")], ctx("req-1", tenant="globex"))

    # globex's write does not wait for acme's unsettled one: it is runnable now.
    with engine.begin() as conn:
        assert store.reserve(conn, globex.operation_ids["c1"], "owner", 30.0) is not None


# ------------------------------------------------------------------ 4: repeated proposals


def test_repeated_write__same_request__reused_pointing_at_the_first_call(engine: Engine) -> None:
    handle = run_enqueue(
        engine,
        [call("c1", "notes.write", "b"), call("c2", "notes.write", "b"), call("c3", "notes.write", "b")],
        ctx("req-1"),
    )

    first, second, third = handle.calls
    assert counts(engine)[0] == 1
    for repeat in (second, third):
        assert isinstance(repeat.status, Pending)
        assert repeat.status.reused_from_call_id == "c1"
        assert repeat.operation_id == first.operation_id
    succeed(engine, first.operation_id or "")
    statuses = results(engine, ctx("req-1"))
    assert [type(s) for s in statuses] == [Succeeded] * 3
    assert [s.reused_from_call_id for s in statuses] == [None, "c1", "c1"]
    assert [s.call_id for s in statuses] == ["c1", "c2", "c3"]


def test_repeated_write__earlier_failed__repeated_failed_call_and_later_writes_blocked(
    engine: Engine,
) -> None:
    first = run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-1", conversation_id="conv-1"))
    fail_terminally(engine, first.operation_ids["c1"])

    handle = run_enqueue(
        engine, [call("c1", "notes.write", "b"), call("c2", "notes.write", "other")],
        ctx("req-2", conversation_id="conv-1"),
    )

    repeat, later = handle.calls
    assert isinstance(repeat.status, FailedTerminal)
    assert repeat.status.error.code is ErrorCode.REPEATED_FAILED_CALL
    assert repeat.status.reused_from_call_id == "c1" and repeat.operation_id is None
    assert isinstance(later.status, FailedTerminal)
    assert later.status.error.code is ErrorCode.PREDECESSOR_FAILED
    assert counts(engine)[0] == 1


def test_repeated_write__earlier_still_pending_then_fails__repeat_reports_repeated_failed_call(
    engine: Engine,
) -> None:
    handle = run_enqueue(engine, [call("c1", "notes.write", "b"), call("c2", "notes.write", "b")], ctx("r"))
    fail_terminally(engine, handle.operation_ids["c1"])

    first, repeat = results(engine, ctx("r"))

    assert isinstance(first, FailedTerminal) and first.error.code is ErrorCode.EXECUTION_FAILED
    assert isinstance(repeat, FailedTerminal) and repeat.error.code is ErrorCode.REPEATED_FAILED_CALL


def test_repeated_write__same_conversation_other_request__reused(engine: Engine) -> None:
    first = run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-1", conversation_id="conv-1"))

    later = ctx("req-2", conversation_id="conv-1")
    [repeat] = run_enqueue(engine, [call("c9", "notes.write", "b")], later).calls

    assert repeat.operation_id == first.operation_ids["c1"]
    assert isinstance(repeat.status, Pending) and repeat.status.reused_from_call_id == "c1"
    assert counts(engine)[0] == 1


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(ctx("req-2", conversation_id="conv-2"), id="other-conversation"),
        pytest.param(ctx("req-2"), id="no-conversation"),
        pytest.param(ctx("req-1", tenant="globex", conversation_id="conv-1"), id="other-tenant"),
    ],
)
def test_repeated_write__outside_the_scope__runs_as_its_own_operation(
    engine: Engine, second: ServerContext
) -> None:
    run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-1", conversation_id="conv-1"))

    [other] = run_enqueue(engine, [call("c1", "notes.write", "b")], second).calls

    assert isinstance(other.status, Pending) and other.status.reused_from_call_id is None
    assert counts(engine)[0] == 2


def test_repeated_proposal__repeatable_tool_or_read__runs_each_time(engine: Engine) -> None:
    handle = run_enqueue(
        engine,
        [call("c1", "notes.pay", "5"), call("c2", "notes.pay", "5"),
         call("c3", "notes.read", "a"), call("c4", "notes.read", "a")],
        ctx("req-1"),
    )

    assert len(set(handle.operation_ids.values())) == 4
    assert all(c.status.reused_from_call_id is None for c in handle.calls)


# ------------------------------------------------------------------ 5: budgets


def _small(**request: int) -> Budgets:
    limits = {"max_calls": 10, "max_writes": 10, "max_calls_per_tool": 10, "max_repeated_failures": 10}
    return Budgets(request=BudgetLimits(**(limits | request)), conversation=BudgetLimits(**limits))


def _code_and_detail(status: Any) -> tuple[ErrorCode, str, str]:
    assert isinstance(status, FailedTerminal)
    [detail] = status.error.details
    return status.error.code, detail.path, detail.code


def test_budget__request_max_calls__later_calls_refused_before_any_gate(engine: Engine) -> None:
    handle = run_enqueue(
        engine, [call(f"c{i}", "notes.read", str(i)) for i in range(3)] + [call("c3", "nope", "x")],
        ctx("req-1"), budgets=_small(max_calls=2),
    )

    assert [type(c.status) for c in handle.calls[:2]] == [Pending, Pending]
    for refused in handle.calls[2:]:
        assert _code_and_detail(refused.status) == (ErrorCode.CALL_BUDGET_EXCEEDED, "request", "max_calls")
        assert refused.operation_id is None
    with engine.connect() as conn:
        gates = conn.execute(select(calls_table.c.gate).order_by(calls_table.c.position)).scalars().all()
    assert gates == [None, None, "budget", "budget"]
    assert counts(engine)[0] == 2


def test_budget__max_writes__reads_still_admitted(engine: Engine) -> None:
    handle = run_enqueue(
        engine,
        [call("c1", "notes.write", "1"), call("c2", "notes.pay", "2"), call("c3", "notes.read", "3")],
        ctx("req-1"), budgets=_small(max_writes=1),
    )

    assert _code_and_detail(handle.calls[1].status)[2] == "max_writes"
    assert isinstance(handle.calls[2].status, Pending)


def test_budget__tool_budget_replaces_the_per_tool_limit(engine: Engine) -> None:
    handle = run_enqueue(engine, [call(f"c{i}", "notes.ping", str(i)) for i in range(3)], ctx("req-1"))

    assert _code_and_detail(handle.calls[2].status) == (
        ErrorCode.CALL_BUDGET_EXCEEDED, "request", "max_calls_per_tool",
    )


def test_budget__conversation__counted_across_requests(engine: Engine) -> None:
    run_enqueue(engine, [call("c1", "notes.ping", "1"), call("c2", "notes.ping", "2")],
                ctx("req-1", conversation_id="conv-1"))
    handle = run_enqueue(engine, [call("c1", "notes.ping", "3"), call("c2", "notes.ping", "4")],
                         ctx("req-2", conversation_id="conv-1"))

    assert isinstance(handle.calls[0].status, Pending)
    assert _code_and_detail(handle.calls[1].status) == (
        ErrorCode.CALL_BUDGET_EXCEEDED, "conversation", "max_calls_per_tool",
    )


def test_budget__repeated_failures__further_calls_of_the_scope_refused(engine: Engine) -> None:
    first = run_enqueue(engine, [call("c1", "notes.write", "b")], ctx("req-0", conversation_id="conv"))
    fail_terminally(engine, first.operation_ids["c1"])

    handle = run_enqueue(
        engine, [call("c1", "notes.write", "b"), call("c2", "notes.read", "a")],
        ctx("req-1", conversation_id="conv"), budgets=_small(max_repeated_failures=1),
    )

    assert isinstance(handle.calls[0].status, FailedTerminal)
    assert handle.calls[0].status.error.code is ErrorCode.REPEATED_FAILED_CALL
    assert _code_and_detail(handle.calls[1].status) == (
        ErrorCode.CALL_BUDGET_EXCEEDED, "request", "max_repeated_failures",
    )


def test_budget__per_tenant_limits(engine: Engine) -> None:
    budgets = Budgets(tenants={"globex": _small(max_calls=1)})

    acme = run_enqueue(engine, [call("c1", "notes.read", "1"), call("c2", "notes.read", "2")],
                       ctx("r", tenant="acme"), budgets=budgets)
    globex = run_enqueue(engine, [call("c1", "notes.read", "1"), call("c2", "notes.read", "2")],
                         ctx("r", tenant="globex"), budgets=budgets)

    assert all(isinstance(c.status, Pending) for c in acme.calls)
    assert _code_and_detail(globex.calls[1].status)[2] == "max_calls"


def test_budget__concurrent_producers_of_one_conversation__never_over_the_limit(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=8)
    roomy = BudgetLimits(max_calls=10, max_writes=10, max_calls_per_tool=10, max_repeated_failures=10)
    budgets = Budgets(request=roomy, conversation=replace(roomy, max_calls=3))
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def producer(index: int) -> None:
        try:
            barrier.wait()
            run_enqueue(engine, [call("c1", "notes.read", str(index))],
                        ctx(f"req-{index}", conversation_id="conv"), budgets=budgets)
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=producer, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors
        with engine.connect() as conn:
            gates = conn.execute(select(calls_table.c.gate)).scalars().all()
        assert sorted(gates, key=str) == sorted([None] * 3 + ["budget"] * 3, key=str)
    finally:
        engine.dispose()
