"""The operation store's statements, each winning and losing its compare-and-set.

Every test runs on SQLite and on PostgreSQL (the `engine` fixture) with a
`ManualClock`, so lease expiry is a step of the test rather than a sleep. A CAS
that loses must change nothing: not the row, not the audit trail, not the outbox.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, event, func, insert, select, text, update

from executor import store
from executor.core.approvers import ApprovalSubject, ApproverPolicy, ApproverRefusal
from executor.core.states import State, is_legal
from executor.core.tools import Access, Approval, Effect, Mode, Registry, Tool
from executor.core.types import ErrorCode, ServerContext
from executor.store import (
    Conflict,
    Created,
    DecisionOutcome,
    InProgress,
    NewOperation,
    Reservation,
    Reused,
)
from executor.store.clock import ManualClock
from executor.store.engine import make_engine, single_statement
from executor.store.schema import audit_events, operations, outbox, receipts
from tests.netkit import REFUSED_PASSWORD, Directory

LEASE = 30.0
SECRET_ARGUMENT = "card-4111-1111-1111-1111"


class RefundArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str = ""
    amount: int = 0


def refund_tool(approvers: ApproverPolicy) -> Tool[RefundArgs]:
    """The declaration of the operations below: who may decide their approvals."""
    return Tool(
        name="refund_order", description="", mode=Mode.WRITE, input_model=RefundArgs,
        untrusted_output=False,
        output_model=RefundArgs, run=lambda args, ctx: None, access=Access.for_roles("support"),
        approval=Approval.always(), approvers=approvers, effect=[Effect.IDEMPOTENT],
    )


REGISTRY = Registry([refund_tool(ApproverPolicy.for_roles("approver"))])


def approver(principal: str, tenant: str = "tenant-a", *roles: str) -> ServerContext:
    return ServerContext(
        principal=principal, tenant=tenant, roles=frozenset(roles or ("approver",)),
        request_id="approvals",
    )


BOB, CAROL = approver("bob"), approver("carol")


def intent(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def new_operation(
    operation_id: str | None = None,
    *,
    request_id: str = "req-1",
    position: int = 0,
    mode: str = "write",
    intent_hash: str = intent("refund ord-1 200"),
    needs_approval: bool = False,
    arguments: dict[str, Any] | None = None,
    approval_ttl_seconds: float = 3600.0,
) -> NewOperation:
    return NewOperation(
        operation_id=operation_id or f"op-{uuid.uuid4().hex[:10]}",
        request_id=request_id,
        call_id=f"call-{position}",
        position=position,
        tool_name="refund_order",
        schema_version=1,
        mode=mode,
        intent_hash=intent_hash,
        arguments=arguments if arguments is not None else {"order_id": "ord-1", "amount": 200},
        context={"principal": "alice", "tenant": "tenant-a", "roles": [], "request_id": request_id},
        needs_approval=needs_approval,
        impact={"refund_cents": 200} if needs_approval else None,
        approval_ttl_seconds=approval_ttl_seconds,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class Store:
    """The store's functions, each in its own transaction, on one clock."""

    def __init__(self, engine: Engine, clock: ManualClock) -> None:
        self.engine = engine
        self.clock = clock

    def __getattr__(self, name: str) -> Any:
        function = getattr(store, name)
        takes_clock = "clock" in inspect.signature(function).parameters
        kwargs_clock = {"clock": self.clock} if takes_clock else {}

        def in_transaction(*args: Any, **kwargs: Any) -> Any:
            with self.engine.begin() as conn:
                return function(conn, *args, **kwargs_clock, **kwargs)

        return in_transaction

    def register_queued(self, **fields: Any) -> str:
        created = self.register(new_operation(**fields))
        assert isinstance(created, Created)
        return created.operation_id

    def started(self, owner: str = "owner-a", **fields: Any) -> Reservation:
        operation_id = self.register_queued(**fields)
        reservation = self.reserve(operation_id, owner, LEASE)
        assert reservation is not None
        return reservation

    def row(self, operation_id: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            found = store.get_operation(conn, operation_id)
        assert found is not None
        return dataclasses.asdict(found)

    def audit(self, operation_id: str) -> list[tuple[str | None, str, str, int]]:
        with self.engine.connect() as conn:
            return [
                (e.from_state, e.to_state, e.decision_code, e.generation)
                for e in store.audit_trail(conn, operation_id)
            ]

    def outbox_rows(self, operation_id: str) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(outbox).where(outbox.c.operation_id == operation_id)
                ).scalar_one()
            )

    @contextmanager
    def unchanged(self, operation_id: str) -> Iterator[None]:
        """Asserts the block changed nothing about the operation."""
        before = (self.row(operation_id), self.audit(operation_id), self.outbox_rows(operation_id))
        yield
        after = (self.row(operation_id), self.audit(operation_id), self.outbox_rows(operation_id))
        assert after == before


@pytest.fixture
def s(engine: Engine, clock: ManualClock) -> Store:
    return Store(engine, clock)


# --------------------------------------------------------------------- idempotency table


def test_register__new_operation_id__created_queued_with_audit_and_no_owner(s: Store) -> None:
    created = s.register(new_operation("op-1"))

    assert created == Created("op-1", State.QUEUED, None)
    row = s.row("op-1")
    assert (row["state"], row["generation"], row["owner_token"], row["attempts"]) == (
        "queued", 0, None, 0,
    )
    assert row["available_at"] == s.clock.value
    assert s.audit("op-1") == [(None, "queued", "admitted", 0)]


def test_register__needs_approval__pending_with_single_pending_approval(s: Store) -> None:
    created = s.register(new_operation("op-1", needs_approval=True))

    assert isinstance(created, Created)
    assert created.state is State.PENDING_APPROVAL
    assert created.approval_id is not None
    record = s.approval_for_operation("op-1")
    assert record is not None
    assert (record.state, record.impact, record.expires_at) == (
        "pending", {"refund_cents": 200}, s.clock.value + 3600.0,
    )
    assert s.audit("op-1") == [(None, "pending_approval", "admitted", 0)]


@pytest.mark.parametrize("succeeded", [True, False], ids=["succeeded", "failed_terminal"])
def test_register__same_intent_after_terminal__reused_without_running_again(
    s: Store, succeeded: bool
) -> None:
    # Given an operation that ran to a terminal state
    r = s.started(operation_id="op-1")
    assert s.complete("op-1", r.generation, r.owner_token, intent("refund ord-1 200"),
                      succeeded=succeeded, result={"refund_id": "rf-1"})
    # When the same operation id arrives again with the same intent
    with s.unchanged("op-1"):
        outcome = s.register(new_operation("op-1"))
    # Then the stored outcome is reused and nothing is queued again
    assert outcome == Reused("op-1", State.SUCCEEDED if succeeded else State.FAILED_TERMINAL)


@pytest.mark.parametrize("stage", ["pending_approval", "queued", "started", "retry_wait"])
def test_register__same_intent_while_running__in_progress(s: Store, stage: str) -> None:
    s.register(new_operation("op-1", needs_approval=stage == "pending_approval"))
    if stage in ("started", "retry_wait"):
        r = s.reserve("op-1", "owner-a", LEASE)
        if stage == "retry_wait":
            s.release_to_retry("op-1", r.generation, r.owner_token, delay_seconds=5,
                               error_code=ErrorCode.UPSTREAM_UNAVAILABLE, error={})

    with s.unchanged("op-1"):
        outcome = s.register(new_operation("op-1"))

    assert outcome == InProgress("op-1", State(stage))


@pytest.mark.parametrize("stage", ["queued", "succeeded"])
def test_register__different_intent__conflict_and_nothing_written(s: Store, stage: str) -> None:
    s.register(new_operation("op-1"))
    if stage == "succeeded":
        r = s.reserve("op-1", "owner-a", LEASE)
        s.complete("op-1", r.generation, r.owner_token, intent("refund ord-1 200"), succeeded=True)

    with s.unchanged("op-1"):
        outcome = s.register(new_operation("op-1", intent_hash=intent("refund ord-1 999"),
                                           needs_approval=True))

    assert outcome == Conflict("op-1")
    assert s.approval_for_operation("op-1") is None


# --------------------------------------------------------------------- reserve


def test_reserve__queued_and_due__wins_generation_one_with_lease_on_store_clock(s: Store) -> None:
    operation_id = s.register_queued()

    reservation = s.reserve(operation_id, "owner-a", LEASE)

    assert reservation == Reservation(operation_id, 1, "owner-a", s.clock.value + LEASE, 1, False)
    row = s.row(operation_id)
    assert (row["state"], row["generation"], row["owner_token"], row["lease_expires_at"]) == (
        "started", 1, "owner-a", s.clock.value + LEASE,
    )
    assert s.audit(operation_id)[-1] == ("queued", "started", "reserved", 1)


def test_reserve__already_reserved__second_reserver_loses(s: Store) -> None:
    r = s.started()

    with s.unchanged(r.operation_id):
        assert s.reserve(r.operation_id, "owner-b", LEASE) is None


@pytest.mark.parametrize("stage", ["pending_approval", "succeeded", "failed_terminal", "retry_wait",
                                   "reconciliation_pending"])
def test_reserve__not_queued__loses(s: Store, stage: str) -> None:
    operation_id = s.register_queued(needs_approval=stage == "pending_approval")
    if stage != "pending_approval":
        r = s.reserve(operation_id, "owner-a", LEASE)
        if stage in ("succeeded", "failed_terminal"):
            s.complete(operation_id, r.generation, "owner-a", intent("refund ord-1 200"),
                       succeeded=stage == "succeeded")
        elif stage == "retry_wait":
            s.release_to_retry(operation_id, r.generation, "owner-a", delay_seconds=0,
                               error_code=ErrorCode.TIMEOUT, error={})
        else:
            s.mark_unknown(operation_id, r.generation, owner_token="owner-a", reason="lost")
    assert s.row(operation_id)["state"] == stage

    with s.unchanged(operation_id):
        assert s.reserve(operation_id, "owner-b", LEASE) is None


def test_reserve__unknown_operation__loses(s: Store) -> None:
    assert s.reserve("op-missing", "owner-a", LEASE) is None


def test_reserve__not_yet_available__loses_until_due(s: Store, engine: Engine) -> None:
    operation_id = s.register_queued()
    early = Store(engine, ManualClock(start=s.clock.value - 1))

    with s.unchanged(operation_id):
        assert early.reserve(operation_id, "owner-a", LEASE) is None
    assert s.reserve(operation_id, "owner-a", LEASE) is not None


def test_reserve_first__first_call_queued_and_due__wins_as_reserve_does_and_returns_the_row(
    s: Store,
) -> None:
    operation_id = s.register_queued()

    won = s.reserve_first(operation_id, "owner-a", LEASE)

    assert won is not None
    reservation, row = won
    assert reservation == Reservation(operation_id, 1, "owner-a", s.clock.value + LEASE, 1, False)
    stored = s.get_operation(operation_id)
    assert row == stored
    assert (row.state, row.generation, row.owner_token, row.tool_name, json.loads(row.arguments)) == (
        "started", 1, "owner-a", "refund_order", {"order_id": "ord-1", "amount": 200},
    )
    assert s.audit(operation_id)[-1] == ("queued", "started", "reserved", 1)


def test_reserve_first__read_after_a_settled_write__wins(s: Store) -> None:
    write = s.register_queued(position=0)
    read = s.register_queued(position=1, mode="read")
    r = s.reserve(write, "owner-a", LEASE)
    s.mark_unknown(write, r.generation, owner_token="owner-a", reason="lost")

    won = s.reserve_first(read, "owner-b", LEASE)

    assert won is not None and won[1].mode == "read" and won[1].position == 1


def test_reserve_first__later_write__loses_and_changes_nothing_even_when_reserve_would_win(
    s: Store,
) -> None:
    # Given a write after a write that succeeded: `reserve` would take it, but the
    # worker checks `predecessor_failed` first, so `reserve_first` must not
    first = s.register_queued(position=0)
    later = s.register_queued(position=1)
    r = s.reserve(first, "owner-a", LEASE)
    s.complete(first, r.generation, "owner-a", intent("refund ord-1 200"), succeeded=True)

    with s.unchanged(later):
        assert s.reserve_first(later, "owner-b", LEASE) is None
    assert s.reserve(later, "owner-b", LEASE) is not None


@pytest.mark.parametrize("stage", ["started", "pending_approval", "not_due", "waiting", "missing"])
def test_reserve_first__where_reserve_loses__loses_and_changes_nothing(
    s: Store, engine: Engine, stage: str
) -> None:
    if stage == "missing":
        assert s.reserve_first("op-missing", "owner-a", LEASE) is None
        return
    if stage == "waiting":
        s.register_queued(position=0)  # an earlier write, still queued
        operation_id = s.register_queued(position=1, mode="read")
    else:
        operation_id = s.register_queued(needs_approval=stage == "pending_approval")
    if stage == "started":
        s.reserve(operation_id, "owner-a", LEASE)
    reserver = Store(engine, ManualClock(start=s.clock.value - 1)) if stage == "not_due" else s

    with s.unchanged(operation_id):
        assert reserver.reserve_first(operation_id, "owner-b", LEASE) is None


# --------------------------------------------------------------------- take_over and renew


def test_take_over__lease_expired__new_generation_and_owner_win(s: Store) -> None:
    r = s.started()
    s.clock.advance(LEASE + 1)

    taken = s.take_over(r.operation_id, "owner-b", LEASE)

    assert taken == Reservation(r.operation_id, 2, "owner-b", s.clock.value + LEASE, 2, True)
    assert s.audit(r.operation_id)[-1] == ("started", "started", "lease_takeover", 2)


@pytest.mark.parametrize("elapsed", [0.0, LEASE - 1, LEASE], ids=["fresh", "nearly", "boundary"])
def test_take_over__lease_not_expired__loses(s: Store, elapsed: float) -> None:
    r = s.started()
    s.clock.advance(elapsed)

    with s.unchanged(r.operation_id):
        assert s.take_over(r.operation_id, "owner-b", LEASE) is None


def test_take_over__operation_queued__loses(s: Store) -> None:
    operation_id = s.register_queued()

    with s.unchanged(operation_id):
        assert s.take_over(operation_id, "owner-b", LEASE) is None


def test_renew__live_owner__extends_lease_from_now(s: Store) -> None:
    r = s.started()
    s.clock.advance(LEASE / 2)

    expiry = s.renew(r.operation_id, r.generation, r.owner_token, LEASE)

    assert expiry == s.clock.value + LEASE
    assert s.row(r.operation_id)["lease_expires_at"] == expiry
    assert s.still_owner(r.operation_id, r.generation, r.owner_token)


@pytest.mark.parametrize(
    ("generation", "owner", "elapsed"),
    [(1, "owner-x", 0.0), (0, "owner-a", 0.0), (2, "owner-a", 0.0), (1, "owner-a", LEASE + 1)],
    ids=["wrong_owner", "older_generation", "newer_generation", "lease_expired"],
)
def test_renew__not_the_live_owner__loses_and_lease_not_revived(
    s: Store, generation: int, owner: str, elapsed: float
) -> None:
    r = s.started("owner-a")
    s.clock.advance(elapsed)

    with s.unchanged(r.operation_id):
        assert s.renew(r.operation_id, generation, owner, LEASE) is None
    assert not s.still_owner(r.operation_id, generation, owner)


def test_renew__after_completion__loses(s: Store) -> None:
    r = s.started()
    s.complete(r.operation_id, r.generation, r.owner_token, intent("refund ord-1 200"), succeeded=True)

    with s.unchanged(r.operation_id):
        assert s.renew(r.operation_id, r.generation, r.owner_token, LEASE) is None


# --------------------------------------------------------------------- stale owners


def test_stale_owner__after_take_over__renew_and_complete_change_nothing(s: Store) -> None:
    # Given owner A whose lease expired and owner B who took the operation over
    a = s.started("owner-a")
    s.clock.advance(LEASE + 1)
    b = s.take_over(a.operation_id, "owner-b", LEASE)
    assert b is not None and b.generation == a.generation + 1
    # When A wakes up and tries to renew, complete, retry or give up
    with s.unchanged(a.operation_id):
        assert s.renew(a.operation_id, a.generation, "owner-a", LEASE) is None
        assert not s.complete(a.operation_id, a.generation, "owner-a", intent("refund ord-1 200"),
                              succeeded=True, result={"stale": True}, receipt="rcpt-a")
        assert not s.release_to_retry(a.operation_id, a.generation, "owner-a", delay_seconds=1,
                                      error_code=ErrorCode.TIMEOUT, error={})
        assert not s.mark_unknown(a.operation_id, a.generation, owner_token="owner-a", reason="x")
    # Then only B can finish it
    row = s.row(a.operation_id)
    assert (row["generation"], row["owner_token"]) == (2, "owner-b")
    assert s.complete(b.operation_id, b.generation, "owner-b", intent("refund ord-1 200"),
                      succeeded=True, receipt="rcpt-b")
    assert s.row(a.operation_id)["receipt"] == "rcpt-b"


def test_stale_owner__after_requeue_and_new_reservation__complete_changes_nothing(s: Store) -> None:
    a = s.started("owner-a")
    s.clock.advance(LEASE + 1)
    assert s.requeue_stale(a.operation_id, a.generation)
    b = s.reserve(a.operation_id, "owner-b", LEASE)
    assert b is not None and b.generation == 2

    with s.unchanged(a.operation_id):
        assert not s.complete(a.operation_id, a.generation, "owner-a", intent("refund ord-1 200"),
                              succeeded=True)
        assert s.renew(a.operation_id, a.generation, "owner-a", LEASE) is None


def test_stale_owner__same_token_reused_with_old_generation__loses(s: Store) -> None:
    # Fencing is on (generation, owner), not the token alone.
    a = s.started("owner-a")
    s.clock.advance(LEASE + 1)
    s.take_over(a.operation_id, "owner-a", LEASE)

    with s.unchanged(a.operation_id):
        assert not s.complete(a.operation_id, 1, "owner-a", intent("refund ord-1 200"), succeeded=True)


# --------------------------------------------------------------------- complete


def test_complete__owner_success__succeeded_with_result_and_receipt(s: Store) -> None:
    r = s.started()

    assert s.complete(r.operation_id, r.generation, r.owner_token, intent("refund ord-1 200"),
                      succeeded=True, result={"refund_id": "rf-1"}, receipt="rcpt-1",
                      duration_ms=12.5)

    row = s.row(r.operation_id)
    assert (row["state"], row["owner_token"], row["lease_expires_at"], row["receipt"]) == (
        "succeeded", None, None, "rcpt-1",
    )
    assert json.loads(row["result"]) == {"refund_id": "rf-1"}
    assert row["finished_at"] == s.clock.value
    assert s.audit(r.operation_id)[-1] == ("started", "succeeded", "succeeded", 1)


def test_complete__owner_failure__failed_terminal_with_code(s: Store) -> None:
    r = s.started()

    assert s.complete(r.operation_id, r.generation, r.owner_token, intent("refund ord-1 200"),
                      succeeded=False, error_code=ErrorCode.INVALID_RESULT,
                      error={"message": "bad output"})

    row = s.row(r.operation_id)
    assert (row["state"], row["error_code"], row["result"]) == (
        "failed_terminal", "invalid_result", None,
    )
    assert s.audit(r.operation_id)[-1] == ("started", "failed_terminal", "invalid_result", 1)


@pytest.mark.parametrize(
    ("generation", "owner", "intent_hash"),
    [
        (1, "owner-x", intent("refund ord-1 200")),
        (2, "owner-a", intent("refund ord-1 200")),
        (1, "owner-a", intent("refund ord-1 201")),
    ],
    ids=["wrong_owner", "wrong_generation", "different_intent"],
)
def test_complete__cas_mismatch__loses(
    s: Store, generation: int, owner: str, intent_hash: str
) -> None:
    r = s.started("owner-a")

    with s.unchanged(r.operation_id):
        assert not s.complete(r.operation_id, generation, owner, intent_hash, succeeded=True)


def test_complete__twice__second_loses(s: Store) -> None:
    r = s.started()
    assert s.complete(r.operation_id, 1, r.owner_token, intent("refund ord-1 200"), succeeded=True)

    with s.unchanged(r.operation_id):
        assert not s.complete(r.operation_id, 1, r.owner_token, intent("refund ord-1 200"),
                              succeeded=False)


def receipts_of(engine: Engine, operation_id: str) -> list[tuple[int, str, bool, str]]:
    with engine.connect() as conn:
        return [
            (r.generation, r.receipt, r.accepted, r.source)
            for r in conn.execute(
                select(receipts).where(receipts.c.operation_id == operation_id)
                .order_by(receipts.c.receipt_row_id)
            )
        ]


@pytest.mark.parametrize("fresh", ["rcpt-2", "rcpt-1"], ids=["new_receipt", "same_receipt_again"])
def test_complete_counted__receipt_recorded_with_the_completion__counts_distinct_receipts_with_it(
    s: Store, engine: Engine, fresh: str
) -> None:
    # Given an operation whose handler already reported a receipt mid-run
    r = s.started()
    s.record_receipt(r.operation_id, 1, "rcpt-1", accepted=True, source="worker")

    # When the worker completes it, recording its final receipt in the same statement
    completion = s.complete_counted(
        r.operation_id, 1, r.owner_token, intent("refund ord-1 200"), succeeded=True,
        receipt=fresh, record_receipt_from="worker", count_receipts=True,
    )

    # Then it won, the receipt is recorded once, and the count includes it (distinct)
    assert completion == store.Completion(True, 2 if fresh == "rcpt-2" else 1)
    assert receipts_of(engine, r.operation_id) == [
        (1, "rcpt-1", True, "worker"), (1, fresh, True, "worker"),
    ]
    assert s.row(r.operation_id)["receipt"] == fresh
    assert s.audit(r.operation_id)[-1] == ("started", "succeeded", "succeeded", 1)


def test_complete_counted__stale_owner__loses_but_its_receipt_is_still_recorded(
    s: Store, engine: Engine
) -> None:
    # Given an owner whose lease was taken over: its effect happened all the same
    r = s.started("owner-a")
    s.clock.advance(LEASE + 1)
    assert s.take_over(r.operation_id, "owner-b", LEASE) is not None

    with s.unchanged(r.operation_id):
        completion = s.complete_counted(
            r.operation_id, 1, "owner-a", intent("refund ord-1 200"), succeeded=True,
            receipt="rcpt-stale", record_receipt_from="worker", count_receipts=True,
        )

    # Then the CAS lost and changed nothing, but the receipt is evidence (I1)
    assert completion == store.Completion(False, None)
    assert receipts_of(engine, r.operation_id) == [(1, "rcpt-stale", True, "worker")]


def test_complete_counted__count_without_a_fresh_receipt__counts_the_recorded_ones(s: Store) -> None:
    r = s.started()
    s.record_receipt(r.operation_id, 1, "rcpt-1", accepted=True, source="worker")
    s.record_receipt(r.operation_id, 1, "rcpt-x", accepted=False, source="worker")

    completion = s.complete_counted(
        r.operation_id, 1, r.owner_token, intent("refund ord-1 200"), succeeded=True,
        receipt="rcpt-1", count_receipts=True,
    )

    assert completion == store.Completion(True, 1)


def test_single_statement__postgresql__autocommit_and_the_pool_transactional_again(
    pg_engine: Engine, clock: ManualClock
) -> None:
    s = Store(pg_engine, clock)
    operation_id = s.register_queued()
    single = single_statement(pg_engine)

    # A reservation through it is committed by its one statement (no BEGIN is sent)
    with single.begin() as conn:
        assert conn.connection.dbapi_connection.autocommit is True
        assert store.reserve_first(conn, operation_id, "owner-a", LEASE, clock=clock) is not None
    assert s.row(operation_id)["state"] == "started"
    # And a connection taken from the same pool afterwards is transactional again
    with pg_engine.connect() as conn:
        assert conn.connection.dbapi_connection.autocommit is False
        conn.execute(update(operations).values(state="queued").where(
            operations.c.operation_id == operation_id
        ))
        conn.rollback()
    assert s.row(operation_id)["state"] == "started"


def test_single_statement__sqlite__the_engine_itself(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    try:
        assert single_statement(engine) is engine
    finally:
        engine.dispose()


# --------------------------------------------------------------------- retries


def test_release_to_retry__owner__retry_wait_until_backoff_passes(s: Store) -> None:
    r = s.started()

    assert s.release_to_retry(r.operation_id, r.generation, r.owner_token, delay_seconds=10,
                              error_code=ErrorCode.UPSTREAM_UNAVAILABLE, error={"message": "503"})

    row = s.row(r.operation_id)
    assert (row["state"], row["owner_token"], row["available_at"], row["error_code"]) == (
        "retry_wait", None, s.clock.value + 10, "upstream_unavailable",
    )
    assert s.audit(r.operation_id)[-1] == ("started", "retry_wait", "upstream_unavailable", 1)


def test_release_to_retry__not_owner__loses(s: Store) -> None:
    r = s.started()

    with s.unchanged(r.operation_id):
        assert not s.release_to_retry(r.operation_id, r.generation, "owner-x", delay_seconds=1,
                                      error_code=ErrorCode.TIMEOUT, error={})


def test_promote_due_retry__before_due__loses_then_wins_with_outbox_row(s: Store) -> None:
    r = s.started()
    s.release_to_retry(r.operation_id, 1, r.owner_token, delay_seconds=10,
                       error_code=ErrorCode.TIMEOUT, error={})
    s.clock.advance(9)

    with s.unchanged(r.operation_id):
        assert not s.promote_due_retry(r.operation_id)
    assert s.due_retries(10) == []

    s.clock.advance(1)
    assert s.due_retries(10) == [r.operation_id]
    assert s.promote_due_retry(r.operation_id)
    assert s.row(r.operation_id)["state"] == "queued"
    assert s.outbox_rows(r.operation_id) == 1
    assert s.audit(r.operation_id)[-1] == ("retry_wait", "queued", "retry_due", 1)
    # And the next reservation fences the previous attempt with a new generation.
    again = s.reserve(r.operation_id, "owner-b", LEASE)
    assert again is not None and (again.generation, again.attempts) == (2, 2)


def test_promote_due_retry__twice__second_loses(s: Store) -> None:
    r = s.started()
    s.release_to_retry(r.operation_id, 1, r.owner_token, delay_seconds=0,
                       error_code=ErrorCode.TIMEOUT, error={})
    assert s.promote_due_retry(r.operation_id)

    with s.unchanged(r.operation_id):
        assert not s.promote_due_retry(r.operation_id)


# --------------------------------------------------------------------- unknown outcomes


def test_mark_unknown__by_owner__reconciliation_pending(s: Store) -> None:
    r = s.started()

    assert s.mark_unknown(r.operation_id, r.generation, owner_token=r.owner_token,
                          reason="unsafe_outcome_unknown")

    row = s.row(r.operation_id)
    assert (row["state"], row["owner_token"], row["error_code"]) == (
        "reconciliation_pending", None, "reconciliation_pending",
    )
    assert s.audit(r.operation_id)[-1] == (
        "started", "reconciliation_pending", "unsafe_outcome_unknown", 1,
    )


def test_mark_unknown__with_the_failures_details__kept_for_the_operator(s: Store) -> None:
    # Given a started write whose MCP call timed out after its request left
    r = s.started()
    cause = {"path": "", "code": "mcp_timeout", "expected": None}
    # When its owner marks the outcome unknown with the failure's details
    assert s.mark_unknown(r.operation_id, r.generation, owner_token=r.owner_token,
                          reason="outcome_unknown", details=[cause])
    # Then the operation's error keeps them: `toolfence pending` shows the cause
    assert json.loads(s.row(r.operation_id)["error"]) == {
        "message": "outcome_unknown", "details": [cause],
    }


def test_mark_unknown_expired__lease_live__loses(s: Store) -> None:
    r = s.started()

    with s.unchanged(r.operation_id):
        assert not s.mark_unknown_expired(r.operation_id, r.generation, reason="stale")


def test_mark_unknown_expired__after_expiry__wins_only_for_observed_generation(
    s: Store,
) -> None:
    r = s.started()
    s.clock.advance(LEASE + 1)

    with s.unchanged(r.operation_id):
        assert not s.mark_unknown_expired(r.operation_id, r.generation + 1, reason="x")
    assert s.mark_unknown_expired(r.operation_id, r.generation, reason="lookup_unknown")
    assert s.row(r.operation_id)["state"] == "reconciliation_pending"
    with s.engine.connect() as conn:
        last = store.audit_trail(conn, r.operation_id)[-1]
    assert (last.decision_code, last.actor) == ("lookup_unknown", "reconciler")


def test_mark_unknown__free_text_reason__kept_on_operation_not_in_audit(s: Store) -> None:
    # A reason may be a sentence (longer than the audit's code column) or quote an
    # exception; the append-only audit keeps a stable code.
    r = s.started()
    reason = f"downstream timed out after sending {SECRET_ARGUMENT}; outcome unknown " * 2

    assert s.mark_unknown(r.operation_id, r.generation, owner_token=r.owner_token, reason=reason)

    assert json.loads(s.row(r.operation_id)["error"]) == {"message": reason}
    assert s.audit(r.operation_id)[-1] == (
        "started", "reconciliation_pending", "reconciliation_pending", 1,
    )


def test_fail_unstarted__queued__failed_terminal_without_generation(s: Store) -> None:
    operation_id = s.register_queued()

    assert s.fail_unstarted(operation_id, ErrorCode.PREDECESSOR_FAILED, "earlier write failed")

    row = s.row(operation_id)
    assert (row["state"], row["generation"], row["error_code"]) == (
        "failed_terminal", 0, "predecessor_failed",
    )
    assert s.audit(operation_id)[-1] == ("queued", "failed_terminal", "predecessor_failed", 0)


def test_fail_unstarted__already_started__loses(s: Store) -> None:
    r = s.started()

    with s.unchanged(r.operation_id):
        assert not s.fail_unstarted(r.operation_id, ErrorCode.PREDECESSOR_FAILED, "x")


# --------------------------------------------------------------------- reconciler


def test_requeue_stale__lease_live__loses(s: Store) -> None:
    r = s.started()

    with s.unchanged(r.operation_id):
        assert not s.requeue_stale(r.operation_id, r.generation)


def test_requeue_stale__expired__queued_with_outbox_row_then_next_generation(s: Store) -> None:
    r = s.started()
    s.clock.advance(LEASE + 1)
    assert [o.operation_id for o in s.stale_started(10)] == [r.operation_id]

    assert s.requeue_stale(r.operation_id, r.generation)

    row = s.row(r.operation_id)
    assert (row["state"], row["owner_token"], row["generation"]) == ("queued", None, 1)
    assert s.outbox_rows(r.operation_id) == 1
    assert s.audit(r.operation_id)[-1] == ("started", "queued", "requeued_stale", 1)
    assert s.stale_started(10) == []
    assert s.reserve(r.operation_id, "owner-b", LEASE).generation == 2


def test_requeue_stale__generation_moved_on__loses(s: Store) -> None:
    # Given a reconciler that observed generation 1, then a take-over to generation 2
    r = s.started()
    s.clock.advance(LEASE + 1)
    observed = s.stale_started(10)[0].generation
    s.take_over(r.operation_id, "owner-b", LEASE)
    s.clock.advance(LEASE + 1)  # even once generation 2's lease has expired too

    with s.unchanged(r.operation_id):
        assert not s.requeue_stale(r.operation_id, observed)
        assert not s.record_lookup_result(r.operation_id, observed, result={}, receipt="r")
        assert not s.mark_unknown_expired(r.operation_id, observed, reason="x")


def test_record_lookup_result__expired__succeeded_from_downstream_answer(s: Store) -> None:
    r = s.started()
    s.clock.advance(LEASE + 1)

    assert s.record_lookup_result(r.operation_id, r.generation, result={"refund_id": "rf-9"},
                                  receipt="rcpt-9")

    row = s.row(r.operation_id)
    assert (row["state"], row["receipt"], json.loads(row["result"])) == (
        "succeeded", "rcpt-9", {"refund_id": "rf-9"},
    )
    assert s.audit(r.operation_id)[-1] == ("started", "succeeded", "lookup_done", 1)


def test_record_lookup_result__lease_live__loses(s: Store) -> None:
    r = s.started()

    with s.unchanged(r.operation_id):
        assert not s.record_lookup_result(r.operation_id, r.generation, result={}, receipt=None)


def test_record_lookup_result__owner_completed_first__loses(s: Store) -> None:
    r = s.started()
    s.clock.advance(LEASE + 1)
    # A slow owner may still complete after its lease expired (nobody took over).
    assert s.complete(r.operation_id, 1, r.owner_token, intent("refund ord-1 200"), succeeded=True)

    with s.unchanged(r.operation_id):
        assert not s.record_lookup_result(r.operation_id, 1, result={}, receipt="r")


# --------------------------------------------------------------------- approvals


def pending(s: Store, **fields: Any) -> tuple[str, str]:
    created = s.register(new_operation(needs_approval=True, **fields))
    assert isinstance(created, Created) and created.approval_id is not None
    return created.operation_id, created.approval_id


def test_approve__pending__queued_with_outbox_row(s: Store) -> None:
    operation_id, approval_id = pending(s)

    assert s.approve(approval_id, approver=BOB, registry=REGISTRY).decided

    assert s.row(operation_id)["state"] == "queued"
    assert s.outbox_rows(operation_id) == 1
    assert s.audit(operation_id)[-1] == ("pending_approval", "queued", "approved", 0)
    assert s.get_approval(approval_id).state == "approved"


def test_approve__twice__single_use(s: Store) -> None:
    operation_id, approval_id = pending(s)
    assert s.approve(approval_id, approver=BOB, registry=REGISTRY).decided

    with s.unchanged(operation_id):
        assert not s.approve(approval_id, approver=CAROL, registry=REGISTRY).decided


def test_approve__after_expiry__loses(s: Store) -> None:
    operation_id, approval_id = pending(s, approval_ttl_seconds=60)
    s.clock.advance(60)

    with s.unchanged(operation_id):
        assert not s.approve(approval_id, approver=BOB, registry=REGISTRY).decided


def test_approve__after_denial__loses(s: Store) -> None:
    operation_id, approval_id = pending(s)
    assert s.deny(approval_id, approver=BOB, registry=REGISTRY, reason="too much").decided

    with s.unchanged(operation_id):
        assert not s.approve(approval_id, approver=CAROL, registry=REGISTRY).decided


def test_deny__pending__failed_terminal_approval_denied(s: Store) -> None:
    operation_id, approval_id = pending(s)

    assert s.deny(approval_id, approver=BOB, registry=REGISTRY, reason="too much").decided

    row = s.row(operation_id)
    assert (row["state"], row["error_code"]) == ("failed_terminal", "approval_denied")
    assert s.audit(operation_id)[-1] == ("pending_approval", "failed_terminal", "approval_denied", 0)


def test_deny__after_approval__loses(s: Store) -> None:
    operation_id, approval_id = pending(s)
    assert s.approve(approval_id, approver=BOB, registry=REGISTRY).decided

    with s.unchanged(operation_id):
        assert not s.deny(approval_id, approver=CAROL, registry=REGISTRY, reason="late").decided


ALICE = approver("alice")  # the requester of every operation above (tenant-a)


@pytest.mark.parametrize(
    ("who", "registry", "reason"),
    [
        pytest.param(ALICE, REGISTRY, ApproverRefusal.SELF_APPROVAL, id="requester"),
        pytest.param(approver("bob", "tenant-b"), REGISTRY, ApproverRefusal.OTHER_TENANT, id="other-tenant"),
        pytest.param(approver("carol", "tenant-a", "support"), REGISTRY, ApproverRefusal.ROLE_NOT_ALLOWED,
                     id="wrong-role"),
        pytest.param(
            BOB, Registry([refund_tool(ApproverPolicy.for_roles("approver", rule=lambda a, s: False))]),
            ApproverRefusal.PREDICATE_REFUSED, id="rule-says-no",
        ),
        pytest.param(
            BOB, Registry([refund_tool(ApproverPolicy.when(lambda a, s: 1 / 0 > 0))]),
            ApproverRefusal.POLICY_FAILED, id="rule-raises",
        ),
        pytest.param(BOB, Registry(), ApproverRefusal.NO_APPROVER_POLICY, id="tool-no-longer-declared"),
        pytest.param(
            BOB, Registry([refund_tool(ApproverPolicy.for_roles("approver"))], role_resolver=lambda ctx: []),
            ApproverRefusal.ROLE_NOT_ALLOWED, id="role-revoked-in-the-application",
        ),
        pytest.param(
            BOB, Registry([refund_tool(ApproverPolicy.for_roles("approver"))],
                          role_resolver=lambda ctx: 1 / 0),  # type: ignore[arg-type,return-value]
            ApproverRefusal.POLICY_FAILED, id="role-resolver-raises",
        ),
    ],
)
def test_approve__approver_not_allowed__audited_and_approval_still_pending(
    s: Store, who: ServerContext, registry: Registry, reason: ApproverRefusal
) -> None:
    # Given an operation of alice (tenant-a) waiting for approval
    operation_id, approval_id = pending(s)
    before = s.row(operation_id)

    # When someone the policy does not allow approves it
    decision = s.approve(approval_id, approver=who, registry=registry)

    # Then it is refused with the reason, nothing but the audit trail changed, and
    # the trail names the stable code and who tried
    assert (decision.outcome, decision.refusal) == (DecisionOutcome.APPROVER_NOT_ALLOWED, reason)
    after = s.row(operation_id)
    assert (after["state"], after["generation"]) == (before["state"], before["generation"])
    assert s.get_approval(approval_id).state == "pending"
    assert s.outbox_rows(operation_id) == 0
    assert s.audit(operation_id)[-1] == (
        "pending_approval", "pending_approval", "approver_not_allowed", 0,
    )
    with s.engine.connect() as conn:
        assert store.audit_trail(conn, operation_id)[-1].actor == who.principal
    # ... and an allowed approver still decides it
    assert s.approve(approval_id, approver=BOB, registry=REGISTRY).decided
    assert s.row(operation_id)["state"] == "queued"


@pytest.mark.parametrize("verb", ["approve", "deny"])
@pytest.mark.parametrize("where", ["resolver", "policy rule"])
def test_decide__approver_check_lost_its_connection__unavailable_nothing_audited_then_decides(
    s: Store, pg_url: str, verb: str, where: str
) -> None:
    # Given an operation waiting for approval, and an approver check (the application's
    # role resolver, or the policy's rule) that reads a directory refusing connections
    operation_id, approval_id = pending(s)
    directory = Directory(up_url=pg_url, up=False)
    if where == "resolver":
        registry = Registry(
            [refund_tool(ApproverPolicy.for_roles("approver"))], role_resolver=directory.roles
        )
    else:
        registry = Registry([refund_tool(ApproverPolicy.when(lambda a, subject: directory.ask()))])
    decide = s.approve if verb == "approve" else functools.partial(s.deny, reason="no")

    # When bob decides
    with s.unchanged(operation_id), pytest.raises(store.ApproverUnavailable) as raised:
        decide(approval_id, approver=BOB, registry=registry)

    # Then nothing was decided or audited (no false approver_not_allowed), and the
    # error names the check's exception class, never the directory's DSN
    assert raised.value.kind == "OperationalError"
    assert REFUSED_PASSWORD not in str(raised.value)
    assert s.get_approval(approval_id).state == "pending"
    # When the directory answers again, the same decision goes through
    directory.up = True
    assert decide(approval_id, approver=BOB, registry=registry).decided
    directory.dispose()


def test_approve__self_approval_allowed_by_the_policy__requester_approves(s: Store) -> None:
    registry = Registry([refund_tool(ApproverPolicy.for_roles("approver", allow_self_approval=True))])
    operation_id, approval_id = pending(s)

    assert s.approve(approval_id, approver=ALICE, registry=registry).decided

    assert s.row(operation_id)["state"] == "queued"
    with s.engine.connect() as conn:
        assert conn.execute(
            text("SELECT decided_by FROM toolfence_approvals WHERE approval_id = :a"), {"a": approval_id}
        ).scalar_one() == "alice"


def test_approve__rule_sees_approver_and_operation__decides_by_amount(s: Store) -> None:
    seen: list[tuple[str, ApprovalSubject]] = []

    def up_to_100_unless_lead(who: ServerContext, subject: ApprovalSubject) -> bool:
        seen.append((who.principal, subject))
        return "lead" in who.roles or subject.arguments["amount"] <= 100

    registry = Registry([refund_tool(ApproverPolicy.for_roles("approver", rule=up_to_100_unless_lead))])
    operation_id, approval_id = pending(s)  # amount 200

    refused = s.approve(approval_id, approver=BOB, registry=registry)
    dana = approver("dana", "tenant-a", "approver", "lead")
    lead = s.approve(approval_id, approver=dana, registry=registry)

    assert refused.refusal is ApproverRefusal.PREDICATE_REFUSED
    assert lead.decided
    principal, subject = seen[0]
    assert (principal, subject.operation_id, subject.tool_name) == ("bob", operation_id, "refund_order")
    assert (subject.requester.principal, subject.impact) == ("alice", {"refund_cents": 200})


def test_deny__requester_withdraws_own_call__allowed_but_other_tenant_is_not(s: Store) -> None:
    operation_id, approval_id = pending(s)

    other = s.deny(approval_id, approver=approver("eve", "tenant-b"), registry=REGISTRY, reason="no")
    withdrawn = s.deny(approval_id, approver=approver("alice", "tenant-a", "support"), registry=REGISTRY,
                       reason="changed my mind")

    assert other.refusal is ApproverRefusal.OTHER_TENANT
    assert withdrawn.decided
    assert s.row(operation_id)["error_code"] == "approval_denied"


def test_approve__decided_or_unknown_approval__not_pending_and_no_refusal_audited(s: Store) -> None:
    operation_id, approval_id = pending(s)
    assert s.approve(approval_id, approver=BOB, registry=REGISTRY).decided

    with s.unchanged(operation_id):
        late = s.approve(approval_id, approver=ALICE, registry=REGISTRY)
    unknown = s.approve("apr_nope", approver=BOB, registry=REGISTRY)

    assert late.outcome is DecisionOutcome.NOT_PENDING
    assert unknown.outcome is DecisionOutcome.NOT_PENDING


def test_expire_approval__before_expiry_loses__after_expiry_wins(s: Store) -> None:
    operation_id, approval_id = pending(s, approval_ttl_seconds=60)
    s.clock.advance(59)

    with s.unchanged(operation_id):
        assert not s.expire_approval(approval_id, approver="reaper", reason="ttl")
    assert s.expired_approvals(10) == []

    s.clock.advance(1)
    assert s.expired_approvals(10) == [approval_id]
    assert s.expire_approval(approval_id, approver="reaper", reason="ttl")
    assert s.get_approval(approval_id).state == "expired"
    assert s.audit(operation_id)[-1][2] == "approval_expired"


# --------------------------------------------------------------------- request ordering


def test_reserve__later_write_waits_for_earlier_write_to_be_terminal(s: Store) -> None:
    # Given a request whose proposal order is: read, write, write, read
    read_0 = s.register_queued(position=0, mode="read")
    write_1 = s.register_queued(position=1)
    write_2 = s.register_queued(position=2)
    read_3 = s.register_queued(position=3, mode="read")
    other_request = s.register_queued(request_id="req-2", position=5)

    # Then the first write waits for the read before it (which must not see it),
    # but not for other requests
    started_read = s.reserve(read_0, "w0", LEASE)
    assert started_read is not None
    with s.unchanged(write_1):
        assert s.reserve(write_1, "w1", LEASE) is None
    assert s.reserve(other_request, "w9", LEASE) is not None
    # When the read completes, the write gets a fresh message and may run
    assert s.complete(read_0, 1, "w0", intent("refund ord-1 200"), succeeded=True)
    assert s.outbox_rows(write_1) == 1
    first = s.reserve(write_1, "w1", LEASE)
    assert first is not None
    # And the second write and the trailing read wait for the first write
    with s.unchanged(write_2), s.unchanged(read_3):
        assert s.reserve(write_2, "w2", LEASE) is None
        assert s.reserve(read_3, "w3", LEASE) is None

    # When the first write completes, the successor it unblocks gets a fresh message;
    # the read behind the second write does not (it still waits)
    assert s.complete(write_1, 1, "w1", intent("refund ord-1 200"), succeeded=True)
    assert s.outbox_rows(write_2) == 1 and s.outbox_rows(read_3) == 0
    # Then the second write may run, and the read still waits for it
    second = s.reserve(write_2, "w2", LEASE)
    assert second is not None
    assert s.reserve(read_3, "w3", LEASE) is None
    assert s.complete(write_2, 1, "w2", intent("refund ord-1 200"), succeeded=False)
    assert s.outbox_rows(read_3) == 1
    assert s.reserve(read_3, "w3", LEASE) is not None


@pytest.mark.parametrize("stage", ["started", "retry_wait", "reconciliation_pending",
                                   "pending_approval"])
def test_reserve__earlier_write_not_terminal__later_write_waits(s: Store, stage: str) -> None:
    first = s.register_queued(position=0, needs_approval=stage == "pending_approval")
    if stage != "pending_approval":
        r = s.reserve(first, "w0", LEASE)
        if stage == "retry_wait":
            s.release_to_retry(first, 1, "w0", delay_seconds=0, error_code=ErrorCode.TIMEOUT,
                               error={})
        elif stage == "reconciliation_pending":
            s.mark_unknown(first, r.generation, owner_token="w0", reason="unknown")
    later = s.register_queued(position=1)

    assert s.reserve(later, "w1", LEASE) is None


def test_predecessor_failed__earlier_write_failed__later_write_ends_unstarted(s: Store) -> None:
    first = s.register_queued(position=0)
    later = s.register_queued(position=1)
    assert not s.predecessor_failed(later)
    r = s.reserve(first, "w0", LEASE)
    s.complete(first, r.generation, "w0", intent("refund ord-1 200"), succeeded=False)

    assert s.predecessor_failed(later)
    assert s.fail_unstarted(later, ErrorCode.PREDECESSOR_FAILED, "an earlier write failed")
    assert s.row(later)["generation"] == 0  # it never ran


def test_predecessor_failed__earlier_write_succeeded_or_read_failed__false(s: Store) -> None:
    read = s.register_queued(position=0, mode="read")
    write = s.register_queued(position=1)
    later = s.register_queued(position=2)
    r = s.reserve(read, "r0", LEASE)
    s.complete(read, r.generation, "r0", intent("refund ord-1 200"), succeeded=False)
    w = s.reserve(write, "w1", LEASE)
    s.complete(write, w.generation, "w1", intent("refund ord-1 200"), succeeded=True)

    assert not s.predecessor_failed(later)


# --------------------------------------------------------------------- audit trail


def test_audit__every_transition_one_legal_event_without_owner_token_or_arguments(
    s: Store, engine: Engine
) -> None:
    # Given one operation walked through every kind of transition
    arguments = {"card": SECRET_ARGUMENT, "amount": 4242}
    op_id, approval_id = pending(s, arguments=arguments)
    transitions = [(None, "pending_approval")]
    assert s.approve(approval_id, approver=BOB, registry=REGISTRY).decided
    transitions.append(("pending_approval", "queued"))
    a = s.reserve(op_id, "owner-token-aaaaaaaaaaaaaaaa", LEASE)
    transitions.append(("queued", "started"))
    s.renew(op_id, a.generation, a.owner_token, LEASE)  # not a transition
    assert s.release_to_retry(op_id, a.generation, a.owner_token, delay_seconds=1,
                              error_code=ErrorCode.TIMEOUT, error={"arguments": arguments})
    transitions.append(("started", "retry_wait"))
    s.clock.advance(1)
    assert s.promote_due_retry(op_id)
    transitions.append(("retry_wait", "queued"))
    b = s.reserve(op_id, "owner-token-bbbbbbbbbbbbbbbb", LEASE)
    transitions.append(("queued", "started"))
    s.clock.advance(LEASE + 1)
    c = s.take_over(op_id, "owner-token-cccccccccccccccc", LEASE)
    transitions.append(("started", "started"))
    s.clock.advance(LEASE + 1)
    assert s.requeue_stale(op_id, c.generation)
    transitions.append(("started", "queued"))
    d = s.reserve(op_id, "owner-token-dddddddddddddddd", LEASE)
    transitions.append(("queued", "started"))
    assert s.mark_unknown(op_id, d.generation, owner_token=d.owner_token,
                          reason=f"unknown after sending {SECRET_ARGUMENT}")
    transitions.append(("started", "reconciliation_pending"))
    assert s.resolve(op_id, to_state=State.QUEUED, actor="ops", reference=None, message="retry")
    transitions.append(("reconciliation_pending", "queued"))
    e = s.reserve(op_id, "owner-token-eeeeeeeeeeeeeeee", LEASE)
    transitions.append(("queued", "started"))
    assert s.complete(op_id, e.generation, e.owner_token, intent("refund ord-1 200"),
                      succeeded=True, result={"echo": arguments}, receipt="rcpt-1")
    transitions.append(("started", "succeeded"))

    # Then the audit trail has exactly one legal event per transition, in order,
    events = s.audit(op_id)
    assert [(f, t) for f, t, _, _ in events] == transitions
    assert all(is_legal(f, t) for f, t, _, _ in events)
    generations = [g for _, _, _, g in events]
    assert generations == sorted(generations) and generations[-1] == 5
    # And no event holds an owner token or an argument value.
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(audit_events))]
    dumped = json.dumps(rows, default=str)
    assert len(rows) == len(transitions)
    for owner in (a, b, c, d, e):
        assert owner.owner_token not in dumped
    assert SECRET_ARGUMENT not in dumped
    assert "4242" not in dumped


# --------------------------------------------------------------------- the database clock


def test_lease__database_clock__expires_in_real_time(engine: Engine) -> None:
    # The store's default clock is the database's own (clock_timestamp / julianday).
    with engine.begin() as conn:
        store.register(conn, new_operation("op-1"))
        first = store.reserve(conn, "op-1", "owner-a", 5.0)
    assert first is not None
    with engine.connect() as conn:
        database_now = conn.execute(select(store.DATABASE_CLOCK.now())).scalar_one()
    assert 0 < first.lease_expires_at - database_now <= 5.0
    with engine.begin() as conn:
        assert store.take_over(conn, "op-1", "owner-b", 5.0) is None
        # Renewal measures the new lease from now: a short one expires soon.
        assert store.renew(conn, "op-1", 1, "owner-a", 0.2) is not None

    time.sleep(0.5)

    with engine.begin() as conn:
        assert store.renew(conn, "op-1", 1, "owner-a", 5.0) is None
        second = store.take_over(conn, "op-1", "owner-b", 5.0)
    assert second is not None and second.generation == 2


# --------------------------------------------------------------------- the reconciler's index


@pytest.mark.postgres
def test_stale_started__postgres__planner_uses_partial_index(pg_url: str) -> None:
    # Given a table that is mostly history: 20k terminal rows and a few started ones
    engine = make_engine(pg_url)
    try:
        clock = ManualClock()
        base = {
            "request_id": "req", "call_id": "c", "position": 0, "tool_name": "t",
            "schema_version": 1, "mode": "write", "intent_hash": intent("x"),
            "arguments": "{}", "context": "{}", "available_at": 0.0, "created_at": 0.0,
            "updated_at": 0.0,
        }
        history = [
            base | {"operation_id": f"done-{i}", "state": "succeeded" if i % 5 else "failed_terminal",
                    "generation": 1, "request_id": f"req-{i}"}
            for i in range(20_000)
        ]
        live = [
            base | {"operation_id": f"live-{i}", "state": "started", "generation": 1,
                    "owner_token": f"o{i}", "lease_expires_at": clock.value - 100 + i * 50}
            for i in range(5)
        ]
        with engine.begin() as conn:
            # Two statements: an executemany takes its columns from the first row.
            conn.execute(insert(operations), history)
            conn.execute(insert(operations), live)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE toolfence_operations"))

        # When the reconciler asks for stale started operations (the real query)
        captured: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            if "toolfence_operations" in statement:
                captured.append((statement, parameters))

        event.listen(engine, "before_cursor_execute", capture)
        with engine.begin() as conn:
            stale = store.stale_started(conn, 100)
            clocked = store.stale_started(conn, 100, clock=clock, skip_locked=True)
        event.remove(engine, "before_cursor_execute", capture)
        assert {o.operation_id for o in stale} == {f"live-{i}" for i in range(5)}
        assert [o.operation_id for o in clocked] == ["live-0", "live-1"]

        # Then PostgreSQL plans it on the partial index, not a scan of the history
        assert len(captured) == 2
        with engine.connect() as conn:
            for statement, parameters in captured:
                plan = "\n".join(
                    conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars()
                )
                assert "ix_toolfence_operations_stale_started" in plan, plan
                assert "Seq Scan" not in plan, plan
    finally:
        engine.dispose()
