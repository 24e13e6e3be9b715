"""A statement that must match a partial index's predicate writes it as literals.

An `ON CONFLICT (…) WHERE <predicate>` infers its arbiter index from the predicate;
bound as `$1`, a prepared statement's generic plan matches no partial index and
PostgreSQL refuses the insert (decision 0194). The sweep below finds every ON
CONFLICT with a predicate in the shipped packages, so a new one cannot arrive
without the check (and tests/integration/test_prepared_statements.py running it
past psycopg's prepare threshold).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from executor.store import approvals as approval_store
from executor.store import operator, reads
from executor.store import turns as turn_store
from executor.store.clock import ManualClock
from executor.store.schema import metadata

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("executor", "outbox", "reconciler", "ledger")
# (module, function) of every ON CONFLICT with an index predicate, each run past the
# prepare threshold in tests/integration/test_prepared_statements.py.
KNOWN = {("executor/store/turns.py", "insert_turn")}


def _on_conflicts_with_a_predicate() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for function in ast.walk(tree):
                if not isinstance(function, ast.FunctionDef):
                    continue
                for node in ast.walk(function):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and node.func.attr.startswith("on_conflict_do_")
                        and any(k.arg in {"index_where", "where"} for k in node.keywords)
                    ):
                        found.add((str(path.relative_to(ROOT)), function.name))
    return found


def test_every_on_conflict_with_a_predicate_is_known() -> None:
    assert _on_conflicts_with_a_predicate() == KNOWN


class _Capture:
    """A stand-in connection that compiles what it is given and answers nothing."""

    def __init__(self, dialect: Any) -> None:
        self.dialect = dialect
        self.sql: list[str] = []

    def execute(self, statement: Any, parameters: Any = None) -> Any:
        self.sql.append(str(statement.compile(dialect=self.dialect)))
        return self

    def first(self) -> None:
        return None

    def scalar_one(self) -> float:
        return 0.0

    def all(self) -> list[Any]:
        return []

    def scalars(self) -> list[Any]:
        return []

    def __iter__(self) -> Any:
        return iter(())


def _index_predicate(name: str, dialect: Any) -> str:
    [index] = [i for t in metadata.tables.values() for i in t.indexes if i.name == name]
    where = index.dialect_options[dialect.name]["where"]
    return str(where.compile(dialect=dialect, compile_kwargs={"literal_binds": True, "include_table": False}))


def test_insert_turn__on_conflict_predicate_is_the_index_predicate_as_literals() -> None:
    for dialect in (postgresql.dialect(), sqlite.dialect()):  # type: ignore[no-untyped-call]
        conn = _Capture(dialect)
        turn_store.insert_turn(
            conn,  # type: ignore[arg-type]
            turn_id="turn_x", tenant="t", principal="p", conversation_id="c", scope_key="s",
            context={}, message="m", driver="d", options={}, queue_when_busy=False,
        )
        [insert] = [sql for sql in conn.sql if "ON CONFLICT" in sql]
        target = re.search(r"ON CONFLICT \(([^)]*)\) WHERE (.*?) DO NOTHING", insert, re.S)
        assert target is not None, insert
        assert target.group(1) == "tenant, scope_key"
        # Exactly the index's predicate, with no bound parameter in it
        assert target.group(2) == _index_predicate("ux_toolfence_turns_running", dialect)
        assert target.group(2) == "state = 'running'"


def test_sweeps_over_a_partial_index__name_the_state_as_a_literal() -> None:
    # The reconciler's scans that find their rows through a partial index: a generic
    # plan over `$1` cannot use the index, and would scan the whole table.
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    conn = _Capture(dialect)
    clock = ManualClock(0.0)
    c: Connection = conn  # type: ignore[assignment]
    turn_store.stale_turns(c, 10, clock)
    turn_store.decided_waiting_turns(c, 10)
    turn_store.free_scopes_with_queued_turns(c, 10)
    approval_store.expired_approvals(c, 10, clock)
    approval_store.expired_hosted_approvals(c, 10, clock)
    approval_store.pending_hosted_approvals(c)
    reads.due_retries(c, 10, clock)
    reads.stale_started(c, 10, clock)
    operator.pending_approvals(c)
    operator.reconciliation_pending(c)
    expected = [
        "= 'running'", "= 'waiting_approval'", "running.state = 'running'", "= 'pending'",
        "= 'pending'", "= 'pending'", "= 'retry_wait'", "= 'started'", "= 'pending'",
        "= 'reconciliation_pending'",
    ]
    assert len(conn.sql) == len(expected)
    for sql, literal in zip(conn.sql, expected, strict=True):
        assert literal in sql, sql
