"""`start_turn` checks what it writes into bounded columns before writing, on SQLite and
PostgreSQL: an overlong or unstorable conversation id, turn id, principal, driver spec
or message raises a documented error (`InvalidIdentifier`, `ValueError`) and the
caller's transaction, with the row it wrote first, stays usable and commits. It used
to raise SQLAlchemy's raw `DataError` (`value too long for type character varying`,
`cannot contain NUL`) and abort the caller's transaction on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, String, text

from executor.core.identifiers import InvalidIdentifier
from executor.core.types import ServerContext
from executor.store.schema import turns
from executor.turns.service import DRIVER_MAX_CHARS, TURN_ID_MAX_CHARS, start_turn

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r")
DRIVER = "scripted:turn.jsonl"


@pytest.fixture
def caller(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE business_rows (note TEXT NOT NULL)"))
    return engine


def start(conn: Any, **changes: Any) -> None:
    values: dict[str, Any] = {
        "context": ALICE, "conversation_id": "conv-1", "message": "hello", "driver": DRIVER,
    } | changes
    start_turn(
        conn, values["context"], values["conversation_id"], values["message"],
        driver=values["driver"], turn_id=values.get("turn_id"),
    )


def test_turn_bounds__the_checks_match_the_schema() -> None:
    assert isinstance(turns.c.turn_id.type, String) and turns.c.turn_id.type.length == TURN_ID_MAX_CHARS
    assert isinstance(turns.c.driver.type, String) and turns.c.driver.type.length == DRIVER_MAX_CHARS


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        pytest.param({"conversation_id": "c" * 201}, InvalidIdentifier, id="conversation_id_201"),
        pytest.param({"conversation_id": "c\x00"}, InvalidIdentifier, id="conversation_id_nul"),
        pytest.param({"turn_id": "t" * 65}, InvalidIdentifier, id="turn_id_65"),
        pytest.param({"turn_id": "t\ud800"}, InvalidIdentifier, id="turn_id_lone_surrogate"),
        pytest.param(
            {"context": ALICE.model_copy(update={"principal": "p" * 201})}, InvalidIdentifier,
            id="principal_201",
        ),
        pytest.param({"driver": "scripted:" + "x" * 992}, ValueError, id="driver_1001"),
        pytest.param({"message": "hi\x00"}, ValueError, id="message_nul"),
        pytest.param({"message": "hi\ud800"}, ValueError, id="message_lone_surrogate"),
    ],
)
def test_start_turn__unstorable_input__documented_error_caller_rows_commit(
    caller: Engine, changes: dict[str, Any], error: type[Exception]
) -> None:
    # Given the caller's own row, then a turn whose input no column can hold
    with caller.begin() as conn:
        conn.execute(text("INSERT INTO business_rows VALUES ('before')"))
        with pytest.raises(error) as raised:
            start(conn, **changes)
        # toolfence's own refusal, never the driver's encoding error
        assert not isinstance(raised.value, UnicodeError)
        # Then the transaction is still usable: the caller goes on and commits
        conn.execute(text("INSERT INTO business_rows VALUES ('after')"))
        start(conn)
    with caller.connect() as conn:
        notes = conn.execute(text("SELECT note FROM business_rows ORDER BY note")).scalars().all()
        count = conn.execute(text("SELECT count(*) FROM toolfence_turns")).scalar_one()
    assert notes == ["after", "before"] and count == 1


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"conversation_id": "c" * 200}, id="conversation_id_200"),
        pytest.param({"turn_id": "t" * 64}, id="turn_id_64"),
        pytest.param({"driver": "scripted:" + "x" * 991}, id="driver_1000"),
    ],
)
def test_start_turn__at_the_limit__written(caller: Engine, changes: dict[str, Any]) -> None:
    with caller.begin() as conn:
        start(conn, **changes)
    with caller.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM toolfence_turns")).scalar_one() == 1
