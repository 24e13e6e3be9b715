"""Admission's pipelines on libpq's own pipeline (executor/store/wire.py), against a
real PostgreSQL: statements prepared once per connection and per parameter types,
forgotten exactly when psycopg deallocates them, a statement's error mid-pipeline,
a killed session, a value that cannot be adapted, a pipeline bigger than the
socket's buffers, and the connection's own transaction settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from executor.store import wire
from executor.store.batch import pipelined
from executor.store.engine import PING_IDLE_ENV, make_engine
from tests.netkit import terminate_backend

VALUE = text("SELECT CAST(:x AS BIGINT) AS v")
PAIR = text("SELECT CAST(:a AS TEXT) AS a, CAST(:b AS INTEGER) AS b")


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> Iterator[Engine]:
    """One pooled connection, never pinged: every test sees the same session."""
    monkeypatch.setenv(PING_IDLE_ENV, "60")
    eng = make_engine(pg_url, pool_size=1, max_overflow=0)
    with eng.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS wire_rows (k text PRIMARY KEY, v integer)"))
    yield eng
    eng.dispose()


def _ours(conn: Connection) -> list[str]:
    rows = conn.execute(text(
        "SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'toolfence_') ORDER BY name"
    )).all()
    return [row.name for row in rows]


def _driver(conn: Connection) -> psycopg.Connection[Any]:
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def _pair(result: Any) -> list[Any]:
    row = result.one_or_none()
    assert row is not None
    return [row.a, row.b]


def test_statements__prepared_on_first_use__reused_after(engine: Engine) -> None:
    with engine.begin() as conn:
        first = pipelined(conn, [(VALUE, {"x": 1}), (PAIR, {"a": "a", "b": 2})])
        prepared = _ours(conn)
    with engine.begin() as conn:
        second = pipelined(conn, [(VALUE, {"x": 3}), (PAIR, {"a": "b", "b": 4})])
        assert _ours(conn) == prepared
    assert len(prepared) == 2
    assert [first[0].scalar_one(), *_pair(first[1])] == [1, "a", 2]
    assert [second[0].scalar_one(), *_pair(second[1])] == [3, "b", 4]


def test_one_statement_with_values_of_other_types__prepared_per_types__read_right(engine: Engine) -> None:
    # psycopg dumps a small int, a large one and None with different type oids: a
    # statement prepared for one must never run with another's bytes.
    values = [5, 2**40, None, -(2**33), 7]
    with engine.begin() as conn:
        got = [pipelined(conn, [(VALUE, {"x": value})])[0].scalar_one() for value in values]
        names = _ours(conn)
    assert got == values
    assert 2 <= len(names) <= 4


def test_percent_signs_and_a_name_used_twice__sent_as_the_server_takes_them(engine: Engine) -> None:
    statement = text("SELECT 'a%b' AS s, CAST(:x AS INTEGER) + CAST(:x AS INTEGER) AS twice")
    with engine.begin() as conn:
        row = pipelined(conn, [(statement, {"x": 21})])[0].one_or_none()
    assert row is not None
    assert (row.s, row.twice) == ("a%b", 42)


def test_psycopg_deallocating_on_rollback__ours_forgotten__next_pipeline_prepares(engine: Engine) -> None:
    with engine.begin() as conn:
        pipelined(conn, [(VALUE, {"x": 1})])
        assert len(_ours(conn)) == 1
        for _ in range(6):  # psycopg prepares its own statement from its fifth use on
            conn.exec_driver_sql("SELECT 1 WHERE %(x)s::int = 1", {"x": 1})
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 2")
        conn.rollback()  # psycopg: ROLLBACK, then DEALLOCATE ALL (it had a name)
        assert _ours(conn) == []
        conn.rollback()
    with engine.begin() as conn:
        assert pipelined(conn, [(VALUE, {"x": 9})])[0].scalar_one() == 9
        assert len(_ours(conn)) == 1


def test_discard_all_by_hand__fails_once_with_26000__then_prepares_again(engine: Engine) -> None:
    with engine.begin() as conn:
        pipelined(conn, [(VALUE, {"x": 1})])
    with engine.connect() as conn:
        _driver(conn).autocommit = True
        _driver(conn).execute("DISCARD ALL", prepare=False)
        _driver(conn).autocommit = False
    with engine.connect() as conn, pytest.raises(DBAPIError) as raised:
        pipelined(conn, [(VALUE, {"x": 2})])
    assert getattr(raised.value.orig, "sqlstate", None) == "26000"
    with engine.begin() as conn:
        assert pipelined(conn, [(VALUE, {"x": 3})])[0].scalar_one() == 3


def test_a_statement_failing_mid_pipeline__its_sql_in_the_error__nothing_written__connection_reusable(
    engine: Engine,
) -> None:
    insert = text("INSERT INTO wire_rows (k, v) VALUES (:k, :v)")
    with engine.begin() as conn:
        pipelined(conn, [(insert, {"k": "taken", "v": 1})])
    with pytest.raises(IntegrityError) as raised, engine.begin() as conn:
        pipelined(conn, [
            (insert, {"k": "fresh", "v": 2}), (insert, {"k": "taken", "v": 3}), (VALUE, {"x": 4}),
        ])
    assert "INSERT INTO wire_rows" in str(raised.value)
    assert "fresh" not in str(raised.value)  # never the parameters
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT k FROM wire_rows ORDER BY k").scalars().all() == ["taken"]
        assert pipelined(conn, [(VALUE, {"x": 5})])[0].scalar_one() == 5
        assert _driver(conn).pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF


def test_a_value_psycopg_cannot_adapt__refused_before_anything_is_sent(engine: Engine) -> None:
    insert = text("INSERT INTO wire_rows (k, v) VALUES (:k, :v)")
    with pytest.raises(DBAPIError), engine.begin() as conn:
        pipelined(conn, [(insert, {"k": "first", "v": 1}), (VALUE, {"x": object()})])
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM wire_rows").scalar_one() == 0
        assert pipelined(conn, [(VALUE, {"x": 6})])[0].scalar_one() == 6


def test_session_killed_before_the_pipeline__disconnect__pool_replaces_the_connection(engine: Engine) -> None:
    with engine.begin() as conn:
        pipelined(conn, [(VALUE, {"x": 1})])
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    terminate_backend(pid)
    with pytest.raises(OperationalError) as raised, engine.begin() as conn:
        pipelined(conn, [(VALUE, {"x": 2})])
    assert raised.value.connection_invalidated
    with engine.begin() as conn:
        assert pipelined(conn, [(VALUE, {"x": 3})])[0].scalar_one() == 3
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid


def test_results_bigger_than_the_socket_s_buffers__no_deadlock__every_row_read(engine: Engine) -> None:
    wide = text("SELECT repeat('x', :n) AS s, CAST(:i AS INTEGER) AS i")
    statements = [(wide, {"n": 20_000, "i": i}) for i in range(300)]  # 6 MB of results
    with engine.begin() as conn:
        results = pipelined(conn, statements)
    rows = [result.one_or_none() for result in results]
    assert [row.i for row in rows if row is not None] == list(range(300))
    assert {len(row.s) for row in rows if row is not None} == {20_000}


def test_the_pipeline_s_writes__in_the_caller_s_transaction__rolled_back_with_it(engine: Engine) -> None:
    insert = text("INSERT INTO wire_rows (k, v) VALUES (:k, :v)")
    with engine.connect() as conn:
        pipelined(conn, [(insert, {"k": "rolled", "v": 1})])
        conn.rollback()
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM wire_rows").scalar_one() == 0


def test_the_connection_s_isolation_level__the_pipeline_s_transaction_has_it(pg_url: str) -> None:
    eng = make_engine(pg_url, pool_size=1, max_overflow=0, isolation_level="SERIALIZABLE")
    try:
        with eng.begin() as conn:
            level = pipelined(conn, [(text("SELECT current_setting('transaction_isolation') AS l"), {})])
            assert level[0].scalar_one() == "serializable"
    finally:
        eng.dispose()


def test_prepare_threshold_none__statements_run_unnamed(pg_url: str) -> None:
    # A pooler in transaction mode cannot keep a session's prepared statements: the
    # setting that tells psycopg so tells this path too.
    eng = make_engine(pg_url, pool_size=1, max_overflow=0, connect_args={"prepare_threshold": None})
    try:
        with eng.begin() as conn:
            results = pipelined(conn, [(VALUE, {"x": 8}), (bindparam_statement(), {"y": "z"})])
            assert results[0].scalar_one() == 8
            assert _ours(conn) == []
    finally:
        eng.dispose()


def bindparam_statement() -> Any:
    return text("SELECT :y AS y").bindparams(bindparam("y", type_=None))


def test_inside_psycopg_s_own_pipeline__the_direct_path_steps_aside(engine: Engine) -> None:
    with engine.begin() as conn:
        driver = _driver(conn)
        with driver.pipeline():
            assert not wire.supported(driver)
        assert wire.supported(driver)


def test_without_the_direct_path__psycopg_s_cursor_pipeline__same_rows_same_errors(
    engine: Engine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "supported", lambda driver: False)
    insert = text("INSERT INTO wire_rows (k, v) VALUES (:k, :v)")
    with engine.begin() as conn:
        results = pipelined(conn, [
            (insert, {"k": "a", "v": 1}), (VALUE, {"x": 2**40}), (PAIR, {"a": "p", "b": 3}),
        ])
        assert results[0].rowcount == 1
        assert results[1].scalar_one() == 2**40
        assert _pair(results[2]) == ["p", 3]
        assert _ours(conn) == []
    with pytest.raises(IntegrityError) as raised, engine.begin() as conn:
        pipelined(conn, [(insert, {"k": "b", "v": 1}), (insert, {"k": "a", "v": 2})])
    assert "INSERT INTO wire_rows" in str(raised.value)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT k FROM wire_rows")).scalars().all() == ["a"]


def test_an_insert_s_rowcount__as_the_cursor_would_say(engine: Engine) -> None:
    insert = text("INSERT INTO wire_rows (k, v) SELECT 'r' || g, g FROM generate_series(1, 3) AS g")
    with engine.begin() as conn:
        assert pipelined(conn, [(insert, {})])[0].rowcount == 3


@pytest.mark.parametrize(
    "fault", [RuntimeError("a bug half-way"), KeyboardInterrupt()], ids=["error", "interrupt"],
)
def test_a_fault_half_way__connection_closed__error_as_a_disconnect__pool_replaces_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, fault: BaseException,
) -> None:
    with engine.begin() as conn:
        pipelined(conn, [(VALUE, {"x": 1})])
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

    def stopped(*args: Any) -> Any:
        raise fault  # the statements were sent; their results are never read

    monkeypatch.setattr(wire, "_exchange", stopped)
    expected: type[BaseException] = OperationalError if isinstance(fault, Exception) else KeyboardInterrupt
    with pytest.raises(expected), engine.begin() as conn:
        pipelined(conn, [(VALUE, {"x": 2})])
    monkeypatch.undo()
    with engine.begin() as conn:
        assert pipelined(conn, [(VALUE, {"x": 3})])[0].scalar_one() == 3
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid


@pytest.mark.parametrize(
    "fault", [RuntimeError("a bug half-way"), KeyboardInterrupt()], ids=["error", "interrupt"],
)
def test_the_driver_path_s_statement__a_fault_half_way__connection_discarded(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, fault: BaseException,
) -> None:
    from executor.store import driver

    with driver.autocommit(engine) as conn:
        assert conn.execute(VALUE, {"x": 1}).scalar_one() == 1
        pid = conn.execute(text("SELECT pg_backend_pid() AS p")).scalar_one()

    def stopped(*args: Any) -> Any:
        raise fault

    monkeypatch.setattr(wire, "_exchange", stopped)
    expected: type[BaseException] = OperationalError if isinstance(fault, Exception) else KeyboardInterrupt
    with pytest.raises(expected), driver.autocommit(engine) as conn:
        conn.execute(VALUE, {"x": 2})
    monkeypatch.undo()
    with driver.transaction(engine) as conn:
        assert conn.execute(VALUE, {"x": 3}).scalar_one() == 3
        assert conn.execute(text("SELECT pg_backend_pid() AS p")).scalar_one() != pid
