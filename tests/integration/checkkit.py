"""A small real run and the violations of I1–I7 planted in it, the way a bug would
leave the rows (test_check, test_invariant_watch).

The run is real: calls admitted by `enqueue`, run by the worker's `OperationRunner`
in process. The planted rows are what a broken store, worker or producer would
have written, through plain INSERTs and UPDATEs, after the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from notekit import NoteArgs, Out, read_note
from paykit import Paid, PayArgs
from sqlalchemy import Connection, Engine, insert, select, update

from executor.core.identifiers import default_operation_id
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.clock import db_now
from executor.store.schema import audit_events, calls, operations, receipts
from executor.telemetry.exporter import DatabaseCollector
from executor.worker.runner import OperationRunner
from outbox.producer import enqueue

TENANT = "acme"
ALICE = ServerContext(principal="alice", tenant=TENANT, roles=frozenset({"member"}), request_id="r")
STUCK_AFTER = 600.0


def _pay(args: PayArgs, ctx: RunContext) -> Written:
    receipt = f"pay-{ctx.operation_id[-8:]}"
    return Written(Paid(receipt=receipt), receipt)


REGISTRY = Registry([
    Tool(
        name="bank.pay", description="pay from an account", mode=Mode.WRITE, untrusted_output=False,
        input_model=PayArgs, output_model=Paid, run=_pay, access=Access.public_tool(),
        approval=Approval.never(), effect=[Effect.IDEMPOTENT],
    ),
    Tool(
        name="notes.read", description="read a note", mode=Mode.READ, input_model=NoteArgs,
        output_model=Out, run=read_note, access=Access.public_tool(), untrusted_output=False,
        approval=Approval.never(),
    ),
])


@dataclass(frozen=True)
class Run:
    """What the small real run left: a succeeded write, a succeeded read, a rejected call."""

    write: str
    read: str
    rejected_call: str
    rejected_operation: str
    now: float


def make_run(engine: Engine, db_url: str) -> Run:
    """Admit four calls (one rejected by the schema gate) and run the three admitted."""
    proposals = [
        ProposedCall(call_id="c-pay", tool_name="bank.pay", arguments={"account": "a-1", "amount": 5}),
        ProposedCall(call_id="c-read", tool_name="notes.read", arguments={"text": "hello"}),
        ProposedCall(call_id="c-pay-2", tool_name="bank.pay", arguments={"account": "a-2", "amount": 7}),
        # Refused by the schema gate: never runs.
        ProposedCall(call_id="c-bad", tool_name="bank.pay", arguments={"account": "a-1", "amount": -1}),
    ]
    context = ALICE.model_copy(update={"request_id": "req-1"})
    with engine.begin() as conn:
        handle = enqueue(conn, proposals, context, REGISTRY)
    admitted = {c.call_id: c.operation_id for c in handle.calls}
    assert admitted["c-bad"] is None
    runner = OperationRunner(Settings(database_url=db_url, broker_url="memory://"), REGISTRY, engine)
    for call_id in ("c-pay", "c-read", "c-pay-2"):
        operation_id = admitted[call_id]
        assert operation_id is not None
        runner.handle(operation_id)
    with engine.connect() as conn:
        now = float(conn.execute(select(db_now())).scalar_one())
        states = dict(conn.execute(select(operations.c.call_id, operations.c.state)).all())
    assert states == {"c-pay": "succeeded", "c-read": "succeeded", "c-pay-2": "succeeded"}
    return Run(
        write=str(admitted["c-pay"]), read=str(admitted["c-read"]), rejected_call="c-bad",
        rejected_operation=default_operation_id(TENANT, "req-1", "c-bad"), now=now,
    )


def _event(operation_id: str, from_state: str | None, to_state: str, generation: int, at: float,
           decision: str = "planted") -> dict[str, Any]:
    return {
        "operation_id": operation_id, "from_state": from_state, "to_state": to_state,
        "decision_code": decision, "generation": generation, "at": at,
    }


def plant_i1(conn: Connection, run: Run) -> str:
    # A second, different receipt accepted for the write: a second effect downstream.
    conn.execute(insert(receipts).values(
        operation_id=run.write, generation=1, receipt="pay-second", accepted=True, source="worker",
        recorded_at=run.now,
    ))
    return run.write


def plant_i2(conn: Connection, run: Run) -> str:
    # A call admitted an hour ago whose message was lost, and no reconciler ran since.
    with_context = ALICE.model_copy(update={"request_id": "req-lost"})
    handle = enqueue(conn, [ProposedCall(call_id="c-lost", tool_name="notes.read",
                                         arguments={"text": "lost"})], with_context, REGISTRY)
    operation_id = str(handle.calls[0].operation_id)
    conn.execute(update(operations).where(operations.c.operation_id == operation_id).values(
        available_at=run.now - 3600, queued_at=run.now - 3600,
    ))
    return operation_id


def plant_i3(conn: Connection, run: Run) -> str:
    # The write's lease was taken over (generation 2), then the stale generation 1
    # completed it: the CAS on the generation did not hold.
    conn.execute(update(audit_events).where(
        audit_events.c.operation_id == run.write, audit_events.c.to_state == "succeeded"
    ).values(from_state="started", to_state="started", generation=2, decision_code="lease_takeover"))
    conn.execute(insert(audit_events).values(_event(run.write, "started", "succeeded", 1, run.now)))
    conn.execute(update(operations).where(operations.c.operation_id == run.write).values(generation=2))
    return run.write


def plant_i4(conn: Connection, run: Run) -> str:
    # An operation (with its audit event) that no call row admitted.
    invented = "op-invented"
    row = conn.execute(select(operations).where(operations.c.operation_id == run.read)).one()._asdict()
    row.update(operation_id=invented, call_id="c-nobody", state="queued", generation=0,
               created_at=run.now, available_at=run.now, finished_at=None, result=None)
    conn.execute(insert(operations).values(row))
    conn.execute(insert(audit_events).values(_event(invented, None, "queued", 0, run.now)))
    return invented


def plant_i5(conn: Connection, run: Run) -> str:
    # A terminal operation moved on: succeeded → failed_terminal is no transition.
    conn.execute(insert(audit_events).values(
        _event(run.read, "succeeded", "failed_terminal", 1, run.now)
    ))
    return run.read


def plant_i6(conn: Connection, run: Run) -> str:
    # A read's call row answered by the write's operation (a repeat pointed at the wrong one).
    conn.execute(insert(calls).values(
        tenant=TENANT, request_id="req-1", call_id="c-read-again", position=5, tool_name="notes.read",
        operation_id=run.write, reused_from_call_id="c-read", created_at=run.now,
    ))
    return run.write


def plant_i7(conn: Connection, run: Run) -> str:
    # The rejected call's handler ran anyway and its receipt was recorded.
    conn.execute(insert(receipts).values(
        operation_id=run.rejected_operation, generation=1, receipt="pay-rejected", accepted=True,
        source="worker", recorded_at=run.now,
    ))
    return run.rejected_operation


PLANTS: dict[str, Callable[[Connection, Run], str]] = {
    "I1": plant_i1, "I2": plant_i2, "I3": plant_i3, "I4": plant_i4,
    "I5": plant_i5, "I6": plant_i6, "I7": plant_i7,
}


def exporter_gauges(
    collector: DatabaseCollector, name: str = "toolfence_invariant_violations"
) -> dict[str, float]:
    """One scrape of the exporter's database collector: `name`'s samples by their label's value."""
    return {
        next(iter(sample.labels.values()), ""): sample.value
        for family in collector.collect()
        for sample in family.samples if sample.name == name
    }
