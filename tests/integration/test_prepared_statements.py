"""The store's statements keep working once psycopg prepares them (PostgreSQL).

psycopg prepares a statement server-side once it has run `prepare_threshold` times
on a connection (default 5; toolfence's engines leave the default). After five
custom-planned executions PostgreSQL plans it generically, over `$1` instead of
the value: an `INSERT … ON CONFLICT (…) WHERE state = $1` then matches no partial
unique index and is refused (decision 0194; the old code failed at the eleventh).
Every statement with an ON CONFLICT over a partial predicate runs here well past
that on one connection, in the caller's transaction, with both the inserting and
the conflicting path.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, text

from executor.core.states import TurnState
from executor.core.types import ServerContext
from executor.store import turns as turn_store
from executor.store.schema import turns
from executor.turns.service import TurnInProgress, start_turn

pytestmark = pytest.mark.usefixtures("_settings_env")


@pytest.fixture
def _settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TOOLFENCE_TURN_WHEN_BUSY", raising=False)


def _prepare_threshold(conn: Connection) -> int:
    """The threshold psycopg uses on this connection (None would mean never prepare)."""
    threshold = conn.connection.driver_connection.prepare_threshold  # type: ignore[union-attr]
    assert threshold is not None, "the engine turned preparing off: this test would prove nothing"
    return int(threshold)


def _context(i: int) -> ServerContext:
    return ServerContext(
        principal=f"user-{i}", tenant="acme", roles=frozenset({"member"}), request_id=f"r{i}"
    )


def test_twenty_start_turns_on_one_connection__all_written_in_the_callers_transaction(
    pg_engine: Engine,
) -> None:
    # Given one connection and one transaction of the caller's, with a row of its own first
    with pg_engine.connect() as conn, conn.begin():
        conn.execute(text("CREATE TEMP TABLE callers_rows (v text) ON COMMIT DROP"))
        conn.execute(text("INSERT INTO callers_rows VALUES ('mine')"))
        assert _prepare_threshold(conn) < 20
        # When twenty users each start a turn on it
        started = [
            start_turn(conn, _context(i), f"conv-{i}", "hello", driver="scripted:/dev/null").turn_id
            for i in range(20)
        ]
        # And a second turn for a busy scope is refused past the threshold too
        for i in range(3):
            with pytest.raises(TurnInProgress):
                start_turn(conn, _context(i), f"conv-{i}", "again", driver="scripted:/dev/null")
        # Then every turn is written running, and the caller's transaction and row are intact
        running = conn.execute(
            select(func.count()).select_from(turns).where(turns.c.state == TurnState.RUNNING.value)
        ).scalar_one()
        assert running == 20 and len(set(started)) == 20
        assert conn.execute(text("SELECT v FROM callers_rows")).scalar_one() == "mine"


def test_insert_turn_on_conflict_past_the_prepare_threshold__inserts_refuses_and_queues(
    pg_engine: Engine,
) -> None:
    # Given one connection, and how often psycopg runs a statement before preparing it
    with pg_engine.connect() as conn, conn.begin():
        # Past psycopg's threshold and PostgreSQL's five custom plans, with room to spare
        rounds = 3 * _prepare_threshold(conn) + 1

        def insert(turn_id: str, scope: str, *, queue: bool) -> TurnState | None:
            return turn_store.insert_turn(
                conn, turn_id=turn_id, tenant="acme", principal="alice", conversation_id=scope,
                scope_key=scope, context={}, message="m", driver="scripted:/dev/null", options={},
                queue_when_busy=queue,
            )

        # When the ON CONFLICT insert runs that often on each of its three paths
        outcomes = []
        for i in range(rounds):
            outcomes.append(insert(f"turn_a{i}", f"scope-{i}", queue=False))  # a free scope
            outcomes.append(insert(f"turn_b{i}", f"scope-{i}", queue=False))  # busy: refused
            outcomes.append(insert(f"turn_c{i}", f"scope-{i}", queue=True))  # busy: queued
        # Then each answered as the partial unique index decides, every time
        assert outcomes == [TurnState.RUNNING, None, TurnState.QUEUED] * rounds
        # And the statement really was prepared on the server (the generic plan's path ran)
        prepared = conn.execute(
            text("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%ON CONFLICT%'")
        ).scalar_one()
        assert prepared >= 1
