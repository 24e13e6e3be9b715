"""Admission when a tool's hook loses its connection (docs/decisions/0026).

An access rule, business rule check, approval predicate, resources or impact
hook that reads a database (the ledger's rule reads the account's tenant, its
transfer impact the balance) and finds it unreachable has decided nothing.
`enqueue` raises `AdmissionUnavailable` instead of recording `permission_denied`,
`business_rule_violation` or `approval_required` under the call id, which every
retry of the request would have been answered with for good. Real connections
refused by a closed port, on SQLite and PostgreSQL for toolfence's own store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from paykit import Paid, PayArgs
from sqlalchemy import Engine, func, select

from executor import store
from executor.core.admission import Gate
from executor.core.approvers import ApproverPolicy
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.operator import pending_approvals
from executor.store.schema import calls, operations, outbox
from executor.worker.outcomes import OutcomeLabel
from executor.worker.runner import OperationRunner
from outbox.producer import AdmissionUnavailable, enqueue
from outbox.results import results
from tests.netkit import REFUSED_PASSWORD, Directory


@dataclass
class Payments:
    """The payment's downstream: every operation id it ran."""

    runs: list[str] = field(default_factory=list)

    def run(self, args: PayArgs, ctx: RunContext) -> Written:
        self.runs.append(ctx.operation_id)
        return Written(
            Paid(receipt=f"r-{ctx.idempotency_key[:8]}"), ctx.idempotency_key,
            changed_resources=frozenset({f"account:{args.account}"}),
        )


@pytest.fixture
def directory(pg_url: str) -> Iterator[Directory]:
    found = Directory(up_url=pg_url)
    yield found
    found.dispose()


@pytest.fixture
def payments() -> Payments:
    return Payments()


def pay_tool(directory: Directory, payments: Payments, *, where: str) -> Tool[PayArgs]:
    """The payment, with the hook named by `where` reading the directory."""

    def check(args: PayArgs, ctx: ServerContext) -> None:
        directory.ask()

    def resources(args: PayArgs, ctx: ServerContext) -> list[str]:
        directory.ask()
        return [f"account:{args.account}"]

    def impact(args: PayArgs, ctx: ServerContext) -> dict[str, object]:
        return {"directory_answers": directory.ask(), "amount": args.amount}

    return Tool(
        name="bank.pay", description="pay from an account", mode=Mode.WRITE, untrusted_output=False,
        input_model=PayArgs, output_model=Paid, run=payments.run,
        access=Access.for_roles("member", rule=directory.authorizes if where == "rule" else None),
        check=check if where == "check" else None,
        resources=resources if where == "resources" else None,
        impact=impact if where == "impact" else None,
        approval=(
            Approval.always() if where == "impact"
            else Approval.when(lambda args, ctx: not directory.ask()) if where == "predicate"
            else Approval.never()
        ),
        approvers=ApproverPolicy.for_roles("approver"),
        effect=[Effect.FENCED],
    )


def read_tool() -> Tool[PayArgs]:
    return Tool(
        name="bank.quote", description="quote a payment", mode=Mode.READ, untrusted_output=False,
        input_model=PayArgs, output_model=Paid,
        run=lambda args, ctx: Paid(receipt="quote"), access=Access.for_roles("member"),
        approval=Approval.never(),
    )


ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-1")
BOB = ServerContext(principal="bob", tenant="acme", roles=frozenset({"approver"}), request_id="ap")
PAY = ProposedCall(call_id="c-pay", tool_name="bank.pay", arguments={"account": "a-1", "amount": 5})
QUOTE = ProposedCall(call_id="c-quote", tool_name="bank.quote", arguments={"account": "a-1", "amount": 5})


def rows(engine: Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (calls, operations, outbox)
        )


HOOKS = [
    ("rule", Gate.AUTHORIZATION), ("check", Gate.BUSINESS_RULES),
    ("resources", Gate.APPROVAL), ("impact", Gate.APPROVAL), ("predicate", Gate.APPROVAL),
]


@pytest.mark.parametrize(("where", "gate"), HOOKS)
def test_enqueue__rule_cannot_reach_its_database__raises_and_records_nothing_then_retry_admits(
    engine: Engine, db_url: str, directory: Directory, payments: Payments, where: str, gate: Gate
) -> None:
    registry = Registry([read_tool(), pay_tool(directory, payments, where=where)])
    # Given the database the tool's rule reads is down (a real connection refused)
    directory.up = False

    # When a request of a read and the payment is enqueued in the producer's transaction
    with pytest.raises(AdmissionUnavailable) as raised, engine.begin() as conn:
        enqueue(conn, [QUOTE, PAY], ALICE, registry)

    # Then the rule decided nothing: no answer is recorded for any call of the batch
    # (the transaction rolled back), and the error names the tool and gate, not the DSN
    unavailable = raised.value
    assert (unavailable.tool_name, unavailable.gate) == ("bank.pay", gate)
    assert unavailable.kind == "OperationalError"
    assert REFUSED_PASSWORD not in str(unavailable) and "127.0.0.1" not in str(unavailable)
    assert unavailable.__cause__ is None and unavailable.__suppress_context__
    assert rows(engine) == (0, 0, 0)
    assert results(engine, "acme", "req-1") == []

    # When the database answers again and the same request is enqueued again
    directory.up = True
    with engine.begin() as conn:
        handle = enqueue(conn, [QUOTE, PAY], ALICE, registry)

    # Then both calls are admitted (the impact case waits for a person, who approves),
    # and the payment runs once
    assert [c.status.status for c in handle.calls] == ["pending", "pending"]
    quote, pay = handle.calls
    assert quote.operation_id is not None and pay.operation_id is not None
    if where == "impact":
        with engine.begin() as conn:
            [approval] = pending_approvals(conn)
            assert approval.impact["directory_answers"] is True
            store.approve(conn, approval.approval_id, approver=BOB, registry=registry)
    runner = OperationRunner(Settings(database_url=db_url, broker_url="memory://"), registry, engine)
    for operation_id in (quote.operation_id, pay.operation_id):
        assert runner.handle(operation_id).label is OutcomeLabel.SUCCEEDED
    assert [s.status for s in results(engine, "acme", "req-1")] == ["succeeded", "succeeded"]
    assert len(payments.runs) == 1


def test_enqueue__caller_commits_anyway__nothing_of_the_batch_was_written_and_a_retry_admits_it(
    engine: Engine, directory: Directory, payments: Payments
) -> None:
    registry = Registry([read_tool(), pay_tool(directory, payments, where="rule")])
    directory.up = False
    # Given a caller that catches the error and commits its transaction anyway
    with engine.begin() as conn, pytest.raises(AdmissionUnavailable):
        enqueue(conn, [QUOTE, PAY], ALICE, registry)
    # Then nothing of the batch is there: an admission writes once every call is
    # decided (docs/decisions/0212), so the read decided before the rule failed is
    # not half of a request either
    assert results(engine, "acme", "req-1") == []
    assert rows(engine) == (0, 0, 0)

    # When the request is enqueued again with the database back
    directory.up = True
    with engine.begin() as conn:
        handle = enqueue(conn, [QUOTE, PAY], ALICE, registry)

    # Then both are admitted, one operation each
    assert [c.status.status for c in handle.calls] == ["pending", "pending"]
    assert rows(engine)[1] == 2


def test_enqueue__rule_raises_anything_else__still_fails_closed_and_is_recorded(
    engine: Engine, directory: Directory, payments: Payments
) -> None:
    registry = Registry([pay_tool(directory, payments, where="rule")])
    # Given a rule that breaks (not a lost connection)
    directory.raise_instead = KeyError(f"internals {REFUSED_PASSWORD}")

    with engine.begin() as conn:
        [handle] = enqueue(conn, [PAY], ALICE, registry).calls

    # Then the call is denied, as before, with no word of the exception
    assert handle.status.status == "failed_terminal"
    assert handle.status.error.code == "permission_denied"  # type: ignore[union-attr]
    assert REFUSED_PASSWORD not in handle.status.model_dump_json()
    assert [s.error.code for s in results(engine, "acme", "req-1")] == ["permission_denied"]  # type: ignore[union-attr]


@pytest.mark.parametrize("exc", [ConnectionError("directory reset"), TimeoutError("directory timed out")])
def test_enqueue__rule_raises_a_builtin_connection_error__admission_unavailable(
    engine: Engine, directory: Directory, payments: Payments, exc: BaseException
) -> None:
    registry = Registry([pay_tool(directory, payments, where="check")])
    # Given a check whose HTTP-style client raises a connection error of the standard library
    directory.raise_instead = exc

    with pytest.raises(AdmissionUnavailable) as raised, engine.begin() as conn:
        enqueue(conn, [PAY], ALICE, registry)

    assert (raised.value.gate, raised.value.kind) == (Gate.BUSINESS_RULES, type(exc).__name__)
    assert str(exc) not in str(raised.value)
    assert rows(engine) == (0, 0, 0)
