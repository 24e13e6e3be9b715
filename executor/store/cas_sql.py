"""The SQL of one CAS shape: what `operations._transition` executes.

`executor/store/operations.py` holds every CAS and its fence, the WHERE of each
statement (the operation, the state it leaves, the fence); this module builds the
rest of the statement around that WHERE, and nothing here can widen it:

- the SET: the new state, `updated_at`, and leaving `started` clears the owner
  token and the lease (only a `started` operation has an owner); the values a CAS
  names are plain parameters, the clock (`NOW`, `Now(seconds)`) or the column plus
  one (`INCREMENT`);
- RETURNING: the audit columns and whatever the caller asks for;
- on PostgreSQL, in the same statement (one round trip): the audit event for exactly
  that pair of states, whether a later call of the request still waits (a settling
  transition), and a receipt to record (`ReceiptToRecord`). A data-modifying CTE
  runs exactly once, and the event's only for the row the UPDATE changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    CTE,
    ColumnElement,
    Executable,
    Float,
    Select,
    bindparam,
    exists,
    func,
    insert,
    select,
    update,
)

from executor.core.states import SETTLED, State
from executor.store.audit import AUDIT_COLUMNS, event_from
from executor.store.clock import Clock
from executor.store.ordering import keyed_state_is, sql_literal
from executor.store.schema import operations, receipts

_NO_OWNER: Mapping[str, None] = {"owner_token": None, "lease_expires_at": None}


class Now(NamedTuple):
    """A value to SET: the clock, plus `seconds` (bound as a parameter)."""

    seconds: float = 0.0


class _Increment:
    """A value to SET: the column's own value plus one."""


NOW = Now()
INCREMENT = _Increment()


def value_kind(value: Any) -> str:
    if isinstance(value, Now):
        return "now" if value.seconds == 0.0 else "now_plus"
    if isinstance(value, _Increment):
        return "increment"
    return "param"


class ReceiptToRecord(NamedTuple):
    """A receipt a transition records (accepted) along with its CAS; `counted` asks
    for the operation's distinct accepted receipts in the answer."""

    generation: int
    receipt: str
    source: str
    counted: bool = False


def cas_statement(
    clock: Clock,
    postgresql: bool,
    from_state: State,
    to_state: State,
    where: Sequence[ColumnElement[bool]],
    values: tuple[tuple[str, str], ...],
    returning: tuple[str, ...],
    receipt: str | None = None,
) -> Executable:
    """The UPDATE of `from_state → to_state` under exactly `where` (the CAS), its
    values by kind (`value_kind`: the `value_<column>` parameters), returning the
    audit columns and `returning`.

    On PostgreSQL the statement carries the event (`event_*` parameters), a settling
    transition's `later_queued`, and `receipt` ("recorded" or "counted", see
    `_with_receipt`). SQLite gets the UPDATE alone (`_transition` does the rest)."""
    sets: dict[str, Any] = {"state": sql_literal(to_state), "updated_at": clock.now()}
    if from_state is State.STARTED and to_state is not State.STARTED:
        sets |= _NO_OWNER
    for column, kind in values:
        if kind == "now":
            sets[column] = clock.now()
        elif kind == "now_plus":
            sets[column] = clock.now() + bindparam(f"value_{column}", type_=Float())
        elif kind == "increment":
            sets[column] = operations.c[column] + 1
        else:
            sets[column] = bindparam(f"value_{column}", type_=operations.c[column].type)
    moved = (
        update(operations)
        .where(*where)
        .values(**sets)
        .returning(*AUDIT_COLUMNS, *(operations.c[name] for name in returning))
    )
    if not postgresql:
        return moved
    # The CAS and its audit event in one statement (a data-modifying CTE runs exactly
    # once, and only for the row the UPDATE changed): one round trip.
    cte = moved.cte("moved")
    columns: list[Any] = [cte]
    if to_state in SETTLED:
        # Whether any later call of the request is still queued, read in the same
        # statement: almost always none (a request's last or only call), and then the
        # settling transaction needs no successor query of its own.
        later = operations.alias("later")
        columns.append(
            exists()
            .where(
                later.c.tenant == cte.c.tenant,
                later.c.request_id == cte.c.request_id,
                later.c.position > cte.c.position,
                keyed_state_is(later.c.state, State.QUEUED),
            )
            .label("later_queued")
        )
    statement = select(*columns).add_cte(event_from(cte, from_state, to_state, clock).cte("logged"))
    if receipt is not None:
        statement = _with_receipt(statement, cte, clock, counted=receipt == "counted")
    return statement


def _with_receipt(statement: Select[Any], moved: CTE, clock: Clock, *, counted: bool) -> Select[Any]:
    """The transition's statement with a receipt recorded in it (`receipt_*`
    parameters, `accepted`), whether the CAS wins or not: a data-modifying CTE runs
    to completion whatever the rest of the statement reads (a stale owner's receipt
    is evidence too, I1). `counted` adds `accepted_receipts`, the distinct accepted
    receipts of the operation with this one: the statement's snapshot does not see
    its own insert, so the count is of the others, plus one."""
    recorded = insert(receipts).values(
        operation_id=bindparam("cas_operation_id"),
        generation=bindparam("receipt_generation"),
        receipt=bindparam("receipt_value"),
        accepted=True,
        source=bindparam("receipt_source"),
        recorded_at=clock.now(),
    ).returning(receipts.c.receipt_row_id)
    statement = statement.add_cte(recorded.cte("recorded"))
    if not counted:
        return statement
    others = (
        select(func.count(func.distinct(receipts.c.receipt)))
        .where(
            receipts.c.operation_id == moved.c.operation_id,
            receipts.c.accepted.is_(True),
            receipts.c.receipt != bindparam("receipt_value"),
        )
        .scalar_subquery()
    )
    return statement.add_columns((others + 1).label("accepted_receipts"))
