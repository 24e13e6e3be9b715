"""`database_fault`: a database error read by its SQLSTATE class (decision 0193).

The drivers' own exception classes, as SQLAlchemy wraps them: psycopg's per
SQLSTATE (`psycopg.errors.lookup`), its client-side errors (no SQLSTATE), and
SQLite's real errors from a real file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.exc import DBAPIError

from executor.core.types import ErrorCode
from executor.store.errors import (
    DatabaseFault,
    StoreDatabaseError,
    bad_data_refusal,
    database_fault,
    refused_for_bad_data,
)


def _wrapped(orig: BaseException, *, invalidated: bool = False) -> DBAPIError:
    base = psycopg.Error if isinstance(orig, psycopg.Error) else sqlite3.Error
    wrapped = DBAPIError.instance(
        "SELECT 1", None, orig, base, hide_parameters=True, connection_invalidated=invalidated
    )
    assert isinstance(wrapped, DBAPIError)
    return wrapped


def _pg(sqlstate: str) -> DBAPIError:
    return _wrapped(psycopg.errors.lookup(sqlstate)("refused"))


@pytest.mark.parametrize(
    ("sqlstate", "fault"),
    [
        ("08006", DatabaseFault.TRANSIENT),  # connection_failure
        ("08001", DatabaseFault.TRANSIENT),  # sqlclient_unable_to_establish_sqlconnection
        ("57P01", DatabaseFault.TRANSIENT),  # admin_shutdown: pg_terminate_backend
        ("57014", DatabaseFault.TRANSIENT),  # query_canceled (statement_timeout)
        ("40001", DatabaseFault.TRANSIENT),  # serialization_failure
        ("40P01", DatabaseFault.TRANSIENT),  # deadlock_detected
        ("53300", DatabaseFault.TRANSIENT),  # too_many_connections
        ("55P03", DatabaseFault.TRANSIENT),  # lock_not_available
        ("22021", DatabaseFault.BAD_DATA),  # character_not_in_repertoire
        ("22001", DatabaseFault.BAD_DATA),  # string_data_right_truncation
        ("22P02", DatabaseFault.BAD_DATA),  # invalid_text_representation
        ("22003", DatabaseFault.BAD_DATA),  # numeric_value_out_of_range
        ("23505", DatabaseFault.BAD_DATA),  # unique_violation
        ("23503", DatabaseFault.BAD_DATA),  # foreign_key_violation
        ("54000", DatabaseFault.BAD_DATA),  # program_limit_exceeded (an index row too big)
        ("42P01", DatabaseFault.OTHER),  # undefined_table
        ("XX000", DatabaseFault.OTHER),  # internal_error
    ],
)
def test_postgresql_by_sqlstate_class(sqlstate: str, fault: DatabaseFault) -> None:
    assert database_fault(_pg(sqlstate)) is fault


def test_psycopg_client_side_errors__nul_is_bad_data__no_server_is_transient() -> None:
    # psycopg refuses a NUL in text before sending anything: DataError with no SQLSTATE
    nul = _wrapped(psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"))
    assert database_fault(nul) is DatabaseFault.BAD_DATA
    # A refused or dropped connection: OperationalError with no SQLSTATE
    refused = _wrapped(psycopg.OperationalError("connection failed: Connection refused"))
    assert database_fault(refused) is DatabaseFault.TRANSIENT
    # Whatever its class, an error that invalidated the connection is transient
    assert database_fault(_wrapped(psycopg.DataError("x"), invalidated=True)) is DatabaseFault.TRANSIENT


def test_not_a_database_error() -> None:
    assert database_fault(ConnectionResetError()) is DatabaseFault.TRANSIENT
    assert database_fault(OSError("network unreachable")) is DatabaseFault.TRANSIENT
    assert database_fault(ValueError("x")) is None
    assert not refused_for_bad_data(ValueError("x"))


def _sqlite_error(path: Path, sql: str, *, hold_lock: bool = False) -> DBAPIError:
    holder = sqlite3.connect(path, timeout=0, isolation_level=None)
    holder.executescript("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    holder.execute("INSERT OR IGNORE INTO t VALUES ('a', 1)")
    if hold_lock:
        holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute(sql)
    except sqlite3.Error as exc:
        return _wrapped(exc)
    finally:
        other.close()
        holder.close()
    raise AssertionError(f"{sql!r} was not refused")


def test_sqlite__locked_is_transient__constraint_is_bad_data__missing_table_is_other(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    locked = _sqlite_error(db, "INSERT INTO t VALUES ('b', 2)", hold_lock=True)
    assert "locked" in str(locked.orig) and database_fault(locked) is DatabaseFault.TRANSIENT
    unique = _sqlite_error(db, "INSERT INTO t VALUES ('a', 2)")
    assert database_fault(unique) is DatabaseFault.BAD_DATA
    not_null = _sqlite_error(db, "INSERT INTO t VALUES ('c', NULL)")
    assert database_fault(not_null) is DatabaseFault.BAD_DATA
    missing = _sqlite_error(db, "SELECT * FROM no_such_table")
    assert database_fault(missing) is DatabaseFault.OTHER


def test_bad_data_refusal__invalid_arguments_with_a_stable_detail_and_no_text() -> None:
    refusal = bad_data_refusal(_pg("22021"))
    assert refusal is not None and refusal.code is ErrorCode.INVALID_ARGUMENTS
    assert [d.code for d in refusal.details] == ["refused_by_database"]
    assert refusal.message == "the database refused a value of this call"
    assert bad_data_refusal(_pg("08006")) is None and bad_data_refusal(_pg("42P01")) is None


def test_store_database_error__connection_error_only_when_transient() -> None:
    assert StoreDatabaseError.from_dbapi(_pg("57P01")).connection_error
    assert not StoreDatabaseError.from_dbapi(_pg("22021")).connection_error
    assert not StoreDatabaseError.from_dbapi(_pg("54000")).connection_error
    data = StoreDatabaseError.from_dbapi(_pg("22001"))
    assert (data.sqlstate, data.kind) == ("22001", "StringDataRightTruncation")
