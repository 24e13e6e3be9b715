"""Hostile input at the other entry points: admit, neutral call lists, CLI input
files, and enqueue on SQLite and PostgreSQL inside the caller's transaction (a
savepoint rolled back after each example, the caller's own row checked)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text

from executor.core.types import ProposedCall
from tests.fuzz import targets
from tests.fuzz.strategies import (
    DB_FUZZ,
    FUZZ,
    argument_objects,
    argument_texts,
    call_ids,
    cli_files,
    neutral_call_lists,
    tool_names,
)

proposed_calls = st.builds(
    ProposedCall,
    call_id=call_ids,
    tool_name=tool_names,
    arguments=st.one_of(
        argument_texts,
        argument_objects.filter(lambda value: isinstance(value, dict)),
        argument_texts.map(lambda t: t.encode("utf-8", "surrogatepass")),
    ),
)


@FUZZ
@given(call=proposed_calls)
def test_fuzz_admit__any_call__decision_never_exception(call: ProposedCall) -> None:
    targets.admit_call(call)


@FUZZ
@given(value=neutral_call_lists)
def test_fuzz_neutral_calls__any_list__each_call_decided(value: Any) -> None:
    targets.neutral_calls(value)


@FUZZ
@given(text_=cli_files)
def test_fuzz_cli_input__any_file__value_or_user_error(text_: str) -> None:
    targets.cli_input(text_.encode("utf-8", "surrogatepass"))


@pytest.fixture
def conn(engine: Engine) -> Iterator[Connection]:
    with engine.begin() as setup:
        setup.execute(text("CREATE TABLE fuzz_business_rows (note TEXT NOT NULL)"))
    with engine.connect() as connection:
        yield connection


@DB_FUZZ
@given(calls=st.lists(proposed_calls, max_size=4, unique_by=lambda c: c.call_id))
def test_fuzz_enqueue__any_calls__statuses_and_caller_row_survives(
    conn: Connection, calls: list[ProposedCall]
) -> None:
    targets.enqueue_in_rolled_back_transaction(conn, calls)
