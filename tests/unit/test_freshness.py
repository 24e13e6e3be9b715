"""Freshness of results, without I/O: what a tool declares (`max_age_seconds`, an
`Observed` source time), what is stored for a success, and how a stored success
is read back (`observed_at`, `age_seconds`, `stale`) — old stored results included.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter

from executor.core.states import State
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    InvalidResult,
    Mode,
    Observed,
    Tool,
    ToolDeclarationError,
    Written,
)
from executor.core.types import CallStatus, Succeeded
from executor.store.records import OperationRow
from outbox.results import operation_status

OBSERVED_AT = 1_700_000_000.0


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Quote(BaseModel):
    price_cents: int


def _unused(args: Any, ctx: Any) -> Any:
    raise AssertionError("never run here")


def read_tool(**fields: Any) -> Tool[NoArgs]:
    return Tool(
        name="quotes.get", description="a price", mode=Mode.READ, input_model=NoArgs,
        output_model=Quote, run=_unused, access=Access.public_tool(), approval=Approval.never(),
        untrusted_output=False, **fields,
    )


def succeeded_row(result: dict[str, Any] | None, *, finished_at: float | None = OBSERVED_AT) -> OperationRow:
    return OperationRow(
        operation_id="op-1", request_id="req-1", call_id="c1", position=0, tool_name="quotes.get",
        schema_version=1, mode="read", state=State.SUCCEEDED.value, generation=1,
        owner_token=None, lease_expires_at=None, intent_hash="h", arguments="{}", context="{}",
        attempts=1, available_at=0.0, queued_at=0.0,
        result=None if result is None else json.dumps(result), receipt=None, error_code=None,
        error=None, impact=None, created_at=0.0, updated_at=0.0, started_at=0.0,
        finished_at=finished_at,
    )


# ---------------------------------------------------------------- declaration


def test_tool__max_age_on_a_write__refused_at_declaration() -> None:
    with pytest.raises(ToolDeclarationError, match="max_age_seconds is for reads only"):
        Tool(
            name="quotes.set", description="", mode=Mode.WRITE, input_model=NoArgs,
            untrusted_output=False,
            output_model=Quote, run=_unused, access=Access.public_tool(),
            approval=Approval.never(), effect=[Effect.IDEMPOTENT], max_age_seconds=60,
        )


@pytest.mark.parametrize("max_age", [0, -5.0])
def test_tool__non_positive_max_age__refused_at_declaration(max_age: float) -> None:
    with pytest.raises(ToolDeclarationError, match="must be > 0"):
        read_tool(max_age_seconds=max_age)


# ---------------------------------------------------------------- what is stored


def test_stored_result__observed_with_source_time__keeps_it_as_epoch_seconds_beside_max_age() -> None:
    tool = read_tool(max_age_seconds=30)
    source_time = datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))

    stored = tool.stored_result(Observed(Quote(price_cents=120), source_time=source_time))

    assert stored["output"] == {"price_cents": 120}
    assert stored["source_time"] == datetime(2024, 5, 1, 10, 0, tzinfo=UTC).timestamp()
    assert stored["max_age_seconds"] == 30


def test_stored_result__plain_output_without_max_age__stored_as_before() -> None:
    stored = read_tool().stored_result(Quote(price_cents=120))

    assert stored == {
        "output": {"price_cents": 120}, "model_view": {"price_cents": 120}, "untrusted": False,
    }


def test_stored_result__naive_source_time__invalid_result() -> None:
    with pytest.raises(InvalidResult, match="timezone-aware"):
        read_tool().stored_result(Observed(Quote(price_cents=1), source_time=datetime(2024, 5, 1)))


def test_stored_result__write_output_wrapped_in_observed__invalid_result() -> None:
    # Only reads observe: a write's result is its receipt's output, nothing else.
    write = Tool(
        name="quotes.set", description="", mode=Mode.WRITE, input_model=NoArgs,
        untrusted_output=False,
        output_model=Quote, run=_unused, access=Access.public_tool(),
        approval=Approval.never(), effect=[Effect.IDEMPOTENT],
    )
    observed = Observed(Quote(price_cents=1), source_time=datetime.now(UTC))
    with pytest.raises(InvalidResult):
        write.stored_result(Written(output=observed, receipt="r-1").output)


# ---------------------------------------------------------------- read back


@pytest.mark.parametrize(
    ("read_after", "stale"),
    [(0.0, False), (59.5, False), (60.0, False), (60.001, True), (3600.0, True)],
)
def test_operation_status__read_later__age_on_the_read_clock_and_stale_only_past_max_age(
    read_after: float, stale: bool
) -> None:
    row = succeeded_row({
        "output": {"price_cents": 1}, "model_view": {"price_cents": 1}, "untrusted": False,
        "source_time": OBSERVED_AT - 5, "max_age_seconds": 60,
    })

    status = operation_status("c1", "quotes.get", row, now=OBSERVED_AT + read_after)

    assert isinstance(status, Succeeded)
    assert status.observed_at == OBSERVED_AT
    assert status.source_time == OBSERVED_AT - 5
    assert status.age_seconds == pytest.approx(read_after)
    assert status.stale is stale


def test_operation_status__read_clock_behind_observation__age_zero_not_negative() -> None:
    row = succeeded_row({"output": {}, "model_view": {}, "untrusted": False, "max_age_seconds": 1})

    status = operation_status("c1", "quotes.get", row, now=OBSERVED_AT - 0.5)

    assert isinstance(status, Succeeded)
    assert (status.age_seconds, status.stale) == (0.0, False)


def test_operation_status__no_read_clock__observed_at_but_age_and_stale_unknown() -> None:
    status = operation_status("c1", "quotes.get", succeeded_row({"output": {}, "model_view": {}}))

    assert isinstance(status, Succeeded)
    assert (status.observed_at, status.age_seconds, status.stale) == (OBSERVED_AT, None, None)


def test_operation_status__result_stored_before_freshness__observed_at_from_finished_at_never_stale() -> None:
    # A row written by an earlier version: no source time, no max age in its result.
    row = succeeded_row({"output": {"price_cents": 7}, "model_view": {"price_cents": 7}, "untrusted": False})

    status = operation_status("c1", "quotes.get", row, now=OBSERVED_AT + 10 * 86400)

    assert isinstance(status, Succeeded)
    assert status.output == {"price_cents": 7}
    assert (status.observed_at, status.source_time, status.stale) == (OBSERVED_AT, None, False)
    assert status.age_seconds == pytest.approx(10 * 86400)


def test_operation_status__write_receipt__has_an_age_and_is_never_stale() -> None:
    row = succeeded_row({"output": {"receipt": "r-1"}, "model_view": {"receipt": "r-1"}, "untrusted": False})
    row = dataclasses.replace(row, mode="write", tool_name="ledger.transfer", receipt="r-1")

    status = operation_status("c1", "ledger.transfer", row, now=OBSERVED_AT + 86400)

    assert isinstance(status, Succeeded)
    assert (status.age_seconds, status.stale) == (86400.0, False)


def test_succeeded__json_stored_before_freshness_fields__parses_with_them_unknown() -> None:
    old = {
        "status": "succeeded", "call_id": "c1", "tool_name": "quotes.get",
        "operation_id": "op-1", "output": {"price_cents": 1}, "untrusted": False,
    }

    status = TypeAdapter(CallStatus).validate_python(old)

    assert isinstance(status, Succeeded)
    assert (status.observed_at, status.source_time, status.age_seconds, status.stale) == (
        None, None, None, None,
    )
    assert TypeAdapter(CallStatus).validate_python(status.model_dump(mode="json")) == status
