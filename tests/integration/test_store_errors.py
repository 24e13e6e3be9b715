"""Database errors at the store boundary, on PostgreSQL: re-raised as a
`StoreDatabaseError` whose message, repr and traceback carry no statement
parameters (arguments, server context) and no row PostgreSQL quotes back."""

from __future__ import annotations

import traceback

import pytest
from sqlalchemy import Engine, create_engine, insert, text
from sqlalchemy.exc import DBAPIError

from executor.core.types import ProposedCall, ServerContext
from executor.store.engine import make_engine, normalize_url
from executor.store.errors import StoreDatabaseError
from executor.store.records import StoreError
from executor.store.schema import outbox
from outbox.producer import enqueue
from tests.integration.test_input_contract import REGISTRY

CANARY = "sk-storeCANARYstoreCANARY0123456789"


@pytest.fixture
def refusing_pg(pg_url: str) -> str:
    # A constraint that refuses any operation row carrying the canary: PostgreSQL's
    # error for it quotes the whole failing row in its DETAIL.
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text(
            "ALTER TABLE toolfence_operations ADD CONSTRAINT no_canary "
            f"CHECK (arguments NOT LIKE '%{CANARY[:12]}%')"
        ))
    engine.dispose()
    return pg_url


def test_enqueue__database_refuses__store_error_without_parameters(refusing_pg: str) -> None:
    # Given the caller's own engine, made without hide_parameters (toolfence's is not theirs)
    engine: Engine = create_engine(normalize_url(refusing_pg))
    context = ServerContext(principal=f"alice-{CANARY}", tenant="acme", request_id="req-1")
    call = ProposedCall(call_id="c1", tool_name="notes.write", arguments=f'{{"text": "{CANARY}"}}')
    try:
        # When enqueue's insert is refused by the database
        with pytest.raises(StoreDatabaseError) as raised, engine.begin() as conn:
            enqueue(conn, [call], context, REGISTRY)
        # Then the error names the SQLSTATE and class only, is a StoreError, and
        # nothing of the statement's parameters or the row reaches its text or traceback
        error = raised.value
        assert isinstance(error, StoreError)
        assert (error.sqlstate, error.kind, error.connection_error) == ("23514", "CheckViolation", False)
        rendered = "".join(traceback.format_exception(error)) + repr(error)
        assert CANARY not in rendered
        assert "alice" not in rendered
        assert error.__cause__ is None and error.__suppress_context__
    finally:
        engine.dispose()


def test_make_engine__failing_statement__parameters_hidden(pg_url: str) -> None:
    # Given toolfence's own engine
    engine = make_engine(pg_url)
    try:
        # When a statement with a canary parameter fails (a NUL PostgreSQL refuses)
        with pytest.raises(DBAPIError) as raised, engine.begin() as conn:
            conn.execute(insert(outbox).values(
                operation_id=f"{CANARY}\x00", created_at=0.0, next_attempt_at=0.0, attempts=0,
            ))
        # Then SQLAlchemy's message does not render the parameters
        assert CANARY not in str(raised.value)
    finally:
        engine.dispose()
