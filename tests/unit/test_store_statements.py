"""Statements built once per shape (`clock.built_once`): reused on the database clock,
rebuilt on a test clock, and the same SQL either way with its values bound."""

from __future__ import annotations

import re

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from executor.core.states import State
from executor.store import operations as ops
from executor.store.clock import DATABASE_CLOCK, DatabaseClock, ManualClock, built_once


def test_built_once__database_clock__one_object_per_key_and_one_build() -> None:
    builds: list[tuple[object, str]] = []

    @built_once
    def build(clock: object, key: str) -> object:
        builds.append((clock, key))
        return object()

    assert build(DATABASE_CLOCK, "a") is build(DATABASE_CLOCK, "a")
    assert build(DATABASE_CLOCK, "a") is not build(DATABASE_CLOCK, "b")
    assert [key for _, key in builds] == ["a", "b"]
    assert all(type(clock) is DatabaseClock for clock, _ in builds)


def test_built_once__manual_clock__built_afresh_with_its_current_value() -> None:
    clock = ManualClock(start=1234.5)
    first = ops._renew_statement(clock)
    clock.advance(10)
    second = ops._renew_statement(clock)

    assert first is not second
    values = set(second.compile(dialect=sqlite.dialect()).params.values())
    assert 1244.5 in values and 1234.5 not in values


def test_transition_statement__same_shape__one_statement_with_the_values_bound() -> None:
    shape = (
        DATABASE_CLOCK, True, State.STARTED, State.SUCCEEDED, ("owner", "intent"),
        (("result", "param"), ("finished_at", "now")), ("tenant", "request_id", "position"),
    )
    statement = ops._transition_statement(*shape)

    assert ops._transition_statement(*shape) is statement
    sql = str(statement.compile(dialect=postgresql.dialect()))
    # The CAS names the operation, the state it leaves and the owner's fence, all bound
    # or literal enum values; the audit event is in the same statement.
    for fragment in (
        "toolfence_operations.operation_id = %(cas_operation_id)s",
        "(toolfence_operations.state || '') = 'started'",  # by key, see keyed_state_is
        "toolfence_operations.generation = %(fence_generation)s",
        "toolfence_operations.owner_token = %(fence_owner_token)s",
        "toolfence_operations.intent_hash = %(fence_intent_hash)s",
        "INSERT INTO toolfence_audit_events",
        "%(event_decision)s",
    ):
        assert fragment in sql, fragment


def test_transition__unknown_fence_shape__refused_before_any_sql() -> None:
    with pytest.raises(KeyError, match="anything"):
        ops._transition_statement(
            DATABASE_CLOCK, False, State.QUEUED, State.STARTED, ("anything",), (), (),
        )


def test_transition_statement__settling_on_postgresql__asks_for_queued_later_calls_in_it() -> None:
    shape = (
        DATABASE_CLOCK, True, State.STARTED, State.SUCCEEDED, ("owner",), (),
        ("tenant", "request_id", "position"),
    )
    sql = str(ops._transition_statement(*shape).compile(dialect=postgresql.dialect()))

    # One statement: the CAS, its event, and whether a later call of the request waits
    assert "EXISTS (SELECT" in sql and "later.position > moved.position" in sql
    assert "(later.state || '') = 'queued'" in sql and "AS later_queued" in sql
    assert "toolfence_receipts" not in sql


def test_transition_statement__with_a_counted_receipt__records_and_counts_the_others_plus_one() -> None:
    shape = (
        DATABASE_CLOCK, True, State.STARTED, State.SUCCEEDED, ("owner",), (),
        ("tenant", "request_id", "position"), "counted",
    )
    sql = str(ops._transition_statement(*shape).compile(dialect=postgresql.dialect()))

    assert "INSERT INTO toolfence_receipts" in sql and "%(receipt_value)s" in sql
    assert "toolfence_receipts.receipt != %(receipt_value)s" in sql
    others_plus_one = r"receipt != %\(receipt_value\)s::VARCHAR\) \+ %\(param_\d+\)s::INTEGER"
    assert re.search(others_plus_one + " AS accepted_receipts", sql)


def test_transition_statement__not_settling__no_later_calls_asked() -> None:
    shape = (DATABASE_CLOCK, True, State.QUEUED, State.STARTED, ("due",), (), ())
    sql = str(ops._transition_statement(*shape).compile(dialect=postgresql.dialect()))

    assert "later_queued" not in sql
