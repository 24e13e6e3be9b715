"""The worker's two hot statements on the driver's connection (executor/store/driver.py),
against a real PostgreSQL: the same rows, the same transaction semantics and the
same errors as through SQLAlchemy's `Connection`, with really terminated sessions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Boolean, Engine, bindparam, event, func, literal, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from executor import store
from executor.store import driver
from executor.store.engine import PING_IDLE_ENV, make_engine
from executor.store.errors import CONNECTION_ERRORS
from executor.store.records import Created, NewOperation
from executor.store.schema import operations, outbox, receipts
from tests.netkit import REFUSED_PASSWORD, refused_database_url, terminate_backend

LEASE = 30.0
INTENT = "0" * 64


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> Iterator[Engine]:
    """One pooled connection that is never pinged (the test kills its session at will)."""
    monkeypatch.setenv(PING_IDLE_ENV, "60")
    eng = make_engine(pg_url, pool_size=1, max_overflow=0)
    yield eng
    eng.dispose()


def _register(engine: Engine, *, request_id: str | None = None, position: int = 0) -> str:
    request_id = request_id or f"req-{uuid.uuid4().hex[:8]}"
    new = NewOperation(
        operation_id=f"op-{uuid.uuid4().hex[:10]}", request_id=request_id, call_id=f"call-{position}",
        position=position, tool_name="refund_order", schema_version=1, mode="write", intent_hash=INTENT,
        arguments={"order_id": "ord-1", "amount": 200},
        context={"principal": "alice", "tenant": "tenant-a", "roles": [], "request_id": request_id},
        needs_approval=False, impact=None, approval_ttl_seconds=3600.0,
    )
    with engine.begin() as conn:
        created = store.register(conn, new)
    assert isinstance(created, Created)
    return created.operation_id


def _row(engine: Engine, operation_id: str) -> store.OperationRow:
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None
    return row


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _reserved(engine: Engine, **where: Any) -> tuple[str, store.Reservation]:
    """A registered operation, reserved on the driver by `owner-a`."""
    operation_id = _register(engine, **where)
    with driver.autocommit(engine) as conn:
        won = store.reserve_first(conn, operation_id, "owner-a", LEASE)
    assert won is not None
    return operation_id, won[0]


def _first_reserved_second_waiting(engine: Engine) -> tuple[str, store.Reservation, str, int]:
    """A request's first call reserved by `owner-a` and its second registered after it:
    the first's id and reservation, the second's id and its outbox rows so far
    (registration gives the second no message while the first is unsettled)."""
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    first, reservation = _reserved(engine, request_id=request_id, position=0)
    second = _register(engine, request_id=request_id, position=1)
    return first, reservation, second, _outbox_rows(engine, second)


def _outbox_rows(engine: Engine, operation_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(
            select(func.count()).select_from(outbox).where(outbox.c.operation_id == operation_id)
        ).scalar_one())


# ------------------------------------------------------------------ the same rows


def test_reserve_first__on_the_driver__the_row_sqlalchemy_reads_back(engine: Engine) -> None:
    operation_id = _register(engine)

    with driver.autocommit(engine) as conn:
        won = store.reserve_first(conn, operation_id, "owner-a", LEASE)

    assert won is not None
    reservation, row = won
    # The row the statement returned is the row as it now is, read through SQLAlchemy.
    assert row == _row(engine, operation_id)
    assert (row.state, row.generation, row.owner_token, row.attempts) == ("started", 1, "owner-a", 1)
    assert reservation == store.Reservation(operation_id, 1, "owner-a", row.lease_expires_at, 1, False)
    with engine.connect() as conn:
        trail = [(e.from_state, e.to_state, e.decision_code, e.generation)
                 for e in store.audit_trail(conn, operation_id)]
    assert trail == [(None, "queued", "admitted", 0), ("queued", "started", "reserved", 1)]


def test_reserve_first__lost_cas_on_the_driver__none_and_nothing_changed(engine: Engine) -> None:
    operation_id, _ = _reserved(engine)
    before = _row(engine, operation_id)

    with driver.autocommit(engine) as conn:
        assert store.reserve_first(conn, operation_id, "owner-b", LEASE) is None

    assert _row(engine, operation_id) == before


def test_complete_counted__on_the_driver__receipt_recorded_and_counted_in_one_transaction(
    engine: Engine,
) -> None:
    operation_id, reservation = _reserved(engine)

    with driver.transaction(engine) as conn:
        completion = store.complete_counted(
            conn, operation_id, reservation.generation, "owner-a", INTENT, succeeded=True,
            result={"refunded": 200}, receipt="rcpt-1", duration_ms=1.5,
            record_receipt_from="worker", count_receipts=True,
        )

    assert completion == store.Completion(True, 1)
    row = _row(engine, operation_id)
    assert (row.state, row.receipt, row.owner_token, row.result) == (
        "succeeded", "rcpt-1", None, '{"refunded":200}',
    )


def test_complete_counted__stale_owner_on_the_driver__loses_but_its_receipt_is_recorded(
    engine: Engine,
) -> None:
    operation_id, reservation = _reserved(engine)
    before = _row(engine, operation_id)

    with driver.transaction(engine) as conn:
        completion = store.complete_counted(
            conn, operation_id, reservation.generation, "someone-else", INTENT, succeeded=True,
            result={}, receipt="rcpt-stale", record_receipt_from="worker", count_receipts=True,
        )

    assert completion == store.Completion(False, None)
    assert _row(engine, operation_id) == before
    with engine.connect() as conn:
        recorded = conn.execute(
            select(receipts.c.receipt).where(receipts.c.operation_id == operation_id)
        ).scalars().all()
    assert recorded == ["rcpt-stale"]


def test_complete_counted__later_call_queued__successor_woken_in_the_same_driver_transaction(
    engine: Engine,
) -> None:
    first, reservation, second, messages_before = _first_reserved_second_waiting(engine)

    with driver.transaction(engine) as conn:
        completion = store.complete_counted(
            conn, first, reservation.generation, "owner-a", INTENT, succeeded=True, result={},
        )

    assert completion.won
    assert _outbox_rows(engine, second) == messages_before + 1


def test_first_statement_alone__completion_and_successor_wake_up__both_committed(engine: Engine) -> None:
    # The worker's completion (docs/decisions/0229): the CAS in autocommit, the
    # successor's outbox row in a transaction after it.
    first, reservation, second, messages_before = _first_reserved_second_waiting(engine)

    with driver.first_statement_alone(engine) as conn:
        completion = store.complete_counted(
            conn, first, reservation.generation, "owner-a", INTENT, succeeded=True, result={},
            receipt="rcpt-1", record_receipt_from="worker", count_receipts=True,
        )

    assert completion == store.Completion(True, 1)
    assert _row(engine, first).state == "succeeded"
    assert _outbox_rows(engine, second) == messages_before + 1


def test_first_statement_alone__wake_up_fails_after_the_completion__reconciler_finds_the_successor(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Decision 0229's safety argument: the successor's wake-up is no longer atomic with
    # the completion. Given the connection fails right after the completion committed
    first, reservation, second, messages_before = _first_reserved_second_waiting(engine)

    def lost(*_: Any) -> None:
        raise OperationalError("wake-up", {}, Exception("server closed the connection"))

    monkeypatch.setattr("executor.store.operations.release_successors", lost)
    with pytest.raises(OperationalError), driver.first_statement_alone(engine) as conn:
        store.complete(conn, first, reservation.generation, "owner-a", INTENT,
                       succeeded=True, result={})

    # Then the completion stands, the successor got no message, and it is exactly what
    # the reconciler's stale-queued sweep republishes (runnable, queued, no message)
    assert _row(engine, first).state == "succeeded"
    assert _outbox_rows(engine, second) == messages_before
    with engine.connect() as conn:
        assert second in store.stale_queued(conn, -1.0, 1000)


def test_first_statement_alone__one_statement__no_begin_or_commit_sent(engine: Engine) -> None:
    operation_id, reservation = _reserved(engine)

    with driver.first_statement_alone(engine) as conn:
        # Autocommit until the first statement: nothing of a transaction is open yet.
        assert conn._driver.autocommit  # noqa: SLF001
        store.complete(conn, operation_id, reservation.generation, "owner-a", INTENT,
                       succeeded=True, result={})
        # Committed by itself: no transaction is open after it (one would be INTRANS).
        assert conn._driver.info.transaction_status.name == "IDLE"  # noqa: SLF001
        assert not conn._driver.autocommit  # noqa: SLF001 - a later statement would begin one

    assert _row(engine, operation_id).state == "succeeded"


def test_first_statement_alone__exception_after_the_second__first_kept_rest_undone(
    engine: Engine,
) -> None:
    first = _register(engine)
    second = _register(engine)
    pid = _backend_pid(engine)

    with pytest.raises(RuntimeError), driver.first_statement_alone(engine) as conn:
        assert store.reserve_first(conn, first, "owner-a", LEASE) is not None
        assert store.reserve_first(conn, second, "owner-a", LEASE) is not None
        raise RuntimeError("after both statements, before the block's commit")

    assert _row(engine, first).state == "started"  # its own transaction, committed
    assert _row(engine, second).state == "queued"  # the block's transaction, rolled back
    assert _backend_pid(engine) != pid


def test_first_statement_alone__connection_goes_back_transactional(engine: Engine) -> None:
    first = _register(engine)
    second = _register(engine)
    with driver.first_statement_alone(engine) as conn:
        store.reserve_first(conn, first, "owner-a", LEASE)
        store.reserve_first(conn, second, "owner-a", LEASE)

    assert (_row(engine, first).state, _row(engine, second).state) == ("started", "started")
    with engine.connect() as sa_conn:
        sa_conn.execute(text("CREATE TEMP TABLE t_probe2 (n int)"))
        sa_conn.rollback()
        assert sa_conn.execute(
            text("SELECT count(*) FROM pg_tables WHERE tablename = 't_probe2'")
        ).scalar_one() == 0


# ------------------------------------------------------------------ the same transactions


def test_transaction__exception_in_the_block__nothing_committed_connection_discarded(
    engine: Engine,
) -> None:
    operation_id = _register(engine)
    before = _row(engine, operation_id)
    pid = _backend_pid(engine)

    with pytest.raises(RuntimeError), driver.transaction(engine) as conn:
        assert store.reserve_first(conn, operation_id, "owner-a", LEASE) is not None
        raise RuntimeError("after the statement, before the commit")

    assert _row(engine, operation_id) == before
    # Not a database error: the connection's state is not known (a time limit can
    # interrupt a wait on the socket), so it never goes back to the pool.
    assert _backend_pid(engine) != pid


def test_autocommit__connection_goes_back_transactional(engine: Engine) -> None:
    operation_id = _register(engine)
    with driver.autocommit(engine) as conn:
        store.reserve_first(conn, operation_id, "owner-a", LEASE)

    # The pool's one connection, used by SQLAlchemy next: two statements that roll
    # back together (it would have committed the first one in autocommit).
    with engine.connect() as sa_conn:
        sa_conn.execute(text("CREATE TEMP TABLE t_probe (n int)"))
        sa_conn.execute(text("INSERT INTO t_probe VALUES (1)"))
        sa_conn.rollback()
        assert sa_conn.execute(
            text("SELECT count(*) FROM pg_tables WHERE tablename = 't_probe'")
        ).scalar_one() == 0


# ------------------------------------------------------------------ the same errors


def test_killed_session__operational_error_pool_invalidated_next_statement_on_a_new_session(
    engine: Engine,
) -> None:
    operation_id = _register(engine)
    killed = _backend_pid(engine)
    terminate_backend(killed)

    with pytest.raises(OperationalError) as raised, driver.autocommit(engine) as conn:
        store.reserve_first(conn, operation_id, "owner-a", LEASE)

    assert raised.value.connection_invalidated
    assert "owner-a" not in str(raised.value)  # never the parameters
    assert _row(engine, operation_id).state == "queued"
    # The pool replaced the dead connection: the next checkout works, on a new session.
    assert _backend_pid(engine) != killed
    with driver.autocommit(engine) as conn:
        assert store.reserve_first(conn, operation_id, "owner-a", LEASE) is not None


def test_checkout__database_refuses_connections__sqlalchemys_operational_error() -> None:
    # Given an engine whose database refuses connections (a real refused port)
    down = make_engine(refused_database_url("driver"))
    try:
        # When the driver-level path checks a connection out
        with pytest.raises(OperationalError) as raised, driver.autocommit(down):
            pass  # pragma: no cover - the checkout raises
    finally:
        down.dispose()

    # Then it is the error `Connection` raises for the same failure: what the runner
    # and the hooks' callers treat as a lost connection, never with the password
    assert isinstance(raised.value, CONNECTION_ERRORS)
    assert raised.value.statement is None
    assert REFUSED_PASSWORD not in str(raised.value)


def test_rollback__mid_block__undone_and_the_block_goes_on_in_a_new_transaction(engine: Engine) -> None:
    table = f"t_undo_{uuid.uuid4().hex[:8]}"
    with driver.autocommit(engine) as conn:
        conn.execute(text(f"CREATE TABLE {table} (n int)"))
    try:
        with driver.transaction(engine) as conn:
            changed = conn.execute(text(f"INSERT INTO {table} SELECT generate_series(1, 3)"))
            conn.rollback()
            kept = conn.execute(text(f"INSERT INTO {table} VALUES (9)"))
        with driver.autocommit(engine) as conn:
            assert list(conn.execute(text(f"SELECT n FROM {table}")).scalars()) == [9]
        assert (changed.rowcount, kept.rowcount) == (3, 1)
    finally:
        with driver.autocommit(engine) as conn:
            conn.execute(text(f"DROP TABLE {table}"))


def test_refused_statement__dbapi_error_rolled_back_connection_kept(engine: Engine) -> None:
    pid = _backend_pid(engine)
    duplicate = select(literal(1)).where(bindparam("n") == 1)

    with pytest.raises(IntegrityError) as raised, driver.transaction(engine) as conn:
        conn.execute(text("CREATE TEMP TABLE t_unique (n int PRIMARY KEY)"))
        conn.execute(text("INSERT INTO t_unique VALUES (:n)"), {"n": 7})
        conn.execute(text("INSERT INTO t_unique VALUES (:n)"), {"n": 7})

    assert isinstance(raised.value, DBAPIError)
    assert not raised.value.connection_invalidated
    assert "[parameters:" not in str(raised.value)
    # Rolled back (the table is gone with the transaction) and still the same session.
    assert _backend_pid(engine) == pid
    with driver.autocommit(engine) as conn:
        assert conn.execute(duplicate, {"n": 1}).scalar_one() == 1
        assert conn.execute(
            text("SELECT count(*) FROM pg_tables WHERE tablename = 't_unique'")
        ).scalar_one() == 0


def test_execute__missing_parameter__clear_error_nothing_sent(engine: Engine) -> None:
    statement = select(literal(1)).where(bindparam("n") == 1)

    with pytest.raises(TypeError, match="parameter.*n"), driver.autocommit(engine) as conn:
        conn.execute(statement, {})


def test_execute__bind_processor__applied_as_sqlalchemy_would(engine: Engine) -> None:
    # A Boolean literal is bound with SQLAlchemy's strict check: anything but a bool is refused.
    statement = select(
        literal(True, Boolean()).label("yes"), bindparam("flag", type_=Boolean()).label("flag")
    )

    with driver.autocommit(engine) as conn:
        row = conn.execute(statement, {"flag": False}).one_or_none()
        assert row is not None
        assert (row.yes, row.flag) == (True, False)
        with pytest.raises(TypeError):
            conn.execute(statement, {"flag": "not a boolean"})


def test_supported__postgresql_psycopg_only(engine: Engine, sqlite_url: str) -> None:
    lite = make_engine(sqlite_url)
    try:
        assert driver.supported(engine)
        assert not driver.supported(lite)
    finally:
        lite.dispose()


# ------------------------------------------------------------------ the plans


_PARTIAL_INDEXES = {
    "ix_toolfence_operations_queued", "ix_toolfence_operations_stale_started",
    "ix_toolfence_operations_active", "ix_toolfence_operations_retry_wait",
}


def _indexes_in(plan: Any) -> set[str]:
    found = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= _indexes_in(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= _indexes_in(value)
    return found


def _set_state(engine: Engine, ids: list[str], state: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(operations).where(operations.c.operation_id.in_(ids)).values(state=state))


def test_cas__statistics_say_no_operation_is_queued_or_started__rows_found_by_key(
    engine: Engine,
) -> None:
    # Given 200 queued operations the planner's statistics do not know of: the table
    # analysed while none of them was queued or started, as between two vacuums of a
    # busy table (every operation that passed through leaves its index entries)
    ids = [_register(engine) for _ in range(200)]
    _set_state(engine, ids, "succeeded")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE toolfence_operations")
    _set_state(engine, ids, "queued")
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sent.append((statement, parameters))

    # When a worker reserves and completes operations (the statements captured as sent)
    event.listen(engine, "before_cursor_execute", capture)
    try:
        with engine.begin() as conn:
            won = store.reserve_first(conn, ids[0], "owner-a", LEASE)
        assert won is not None
        reservation = sent[-1]
        _set_state(engine, ids[1:], "started")
        with engine.begin() as conn:
            completion = store.complete_counted(
                conn, ids[0], won[0].generation, "owner-a", INTENT, succeeded=True,
                receipt="rcpt-1", record_receipt_from="worker",
            )
        assert completion.won
        completed = sent[-1]
    finally:
        event.remove(engine, "before_cursor_execute", capture)

    # Then each finds its row by the primary key, never by walking a partial index on
    # the state, whose statistics say it is empty while it holds every entry
    with engine.connect() as conn:
        for statement, parameters in (reservation, completed):
            plan = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar_one()
            used = _indexes_in(plan)
            assert "toolfence_operations_pkey" in used, (statement, used)
            assert not used & _PARTIAL_INDEXES, (statement, used)
