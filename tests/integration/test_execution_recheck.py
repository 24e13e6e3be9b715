"""The worker's re-check just before the downstream call (docs/design.md §Worker).

Each test admits a call through the real producer (`enqueue`), changes the world
between admission and execution (a balance spent, a policy changed, a role
revoked in the application), then runs the real `OperationRunner` in process on
SQLite and PostgreSQL. A refusal ends the call `failed_terminal` with a stable
code, an audit decision `<code>_at_execution`, and zero handler invocations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from paykit import Paid, PayArgs
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from executor import store
from executor.core.approvers import ApproverPolicy
from executor.core.tools import (
    Access,
    Approval,
    BusinessRuleViolation,
    Effect,
    Mode,
    Registry,
    RunContext,
    Tool,
    Written,
)
from executor.core.types import FailedTerminal, ProposedCall, ServerContext, Succeeded
from executor.settings import Settings
from executor.worker.outcomes import OutcomeLabel
from executor.worker.runner import OperationRunner
from outbox.producer import enqueue
from outbox.results import results
from tests.netkit import Directory

THRESHOLD = 50_000


@dataclass
class Bank:
    """The downstream's state, and every call the tool's hooks received."""

    balances: dict[str, int] = field(default_factory=lambda: {"acc-1": 100_000})
    runs: list[str] = field(default_factory=list)
    seen_roles: list[frozenset[str]] = field(default_factory=list)
    check_raises: BaseException | None = None
    # idempotency key → receipt: the downstream dedupes a retried write (effect `fenced`
    # downstreams answer a repeated key with the first receipt, as the ledger does)
    by_key: dict[str, str] = field(default_factory=dict)

    def check(self, args: PayArgs, ctx: ServerContext) -> None:
        if self.check_raises is not None:
            raise self.check_raises
        if self.balances[args.account] < args.amount:
            raise BusinessRuleViolation("insufficient funds")

    def run(self, args: PayArgs, ctx: RunContext) -> Written:
        self.runs.append(ctx.operation_id)
        self.seen_roles.append(ctx.server.roles)
        if ctx.idempotency_key not in self.by_key:
            self.balances[args.account] -= args.amount
            self.by_key[ctx.idempotency_key] = f"r-{len(self.by_key) + 1}"
        receipt = self.by_key[ctx.idempotency_key]
        return Written(Paid(receipt=receipt), receipt)

    def effects(self) -> int:
        return len(self.by_key)


def pay_tool(
    bank: Bank, approval: Approval, rule: Callable[[PayArgs, ServerContext], bool] | None = None
) -> Tool[PayArgs]:
    return Tool(
        name="bank.pay", description="pay from an account", mode=Mode.WRITE,
        untrusted_output=False,
        input_model=PayArgs, output_model=Paid, run=bank.run,
        access=Access.for_roles("member", rule=rule), approval=approval,
        approvers=ApproverPolicy.for_roles("approver"), effect=[Effect.FENCED],
        check=bank.check,
    )


LARGE = Approval.when(lambda args, ctx: args.amount >= THRESHOLD)
ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r")
BOB = ServerContext(principal="bob", tenant="acme", roles=frozenset({"approver"}), request_id="ap")


@pytest.fixture
def bank() -> Bank:
    return Bank()


@pytest.fixture
def registry(bank: Bank) -> Registry:
    return Registry([pay_tool(bank, LARGE)])


@pytest.fixture
def runner(engine: Engine, db_url: str, registry: Registry) -> Iterator[OperationRunner]:
    settings = Settings(database_url=db_url, broker_url="memory://", lease_seconds=30.0)
    yield OperationRunner(settings, registry, engine)


def admit_payment(
    engine: Engine, registry: Registry, amount: int, request_id: str
) -> tuple[str, str | None]:
    """(operation id, approval id) of an admitted payment by alice."""
    call = ProposedCall(
        call_id="c1", tool_name="bank.pay", arguments={"account": "acc-1", "amount": amount}
    )
    with engine.begin() as conn:
        handle = enqueue(conn, [call], ALICE.model_copy(update={"request_id": request_id}), registry)
    [admitted] = handle.calls
    assert admitted.operation_id is not None, admitted
    return admitted.operation_id, getattr(admitted.status, "approval_id", None)


def terminal_decision(engine: Engine, operation_id: str) -> tuple[str | None, str, str]:
    with engine.connect() as conn:
        last = store.audit_trail(conn, operation_id)[-1]
    return last.from_state, last.to_state, last.decision_code


def only_result(engine: Engine, request_id: str) -> Any:
    [status] = results(engine, "acme", request_id)
    return status


# ------------------------------------------------------------------ business rules


def test_check_at_execution__balance_spent_since_admission__business_rule_violation_no_run(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given a payment of 400.00 admitted while the account holds 1,000.00
    operation_id, _ = admit_payment(engine, registry, 40_000, "req-1")
    # ... and the balance spent elsewhere before a worker runs it
    bank.balances["acc-1"] = 30_000

    # When the worker handles it
    outcome = runner.handle(operation_id)

    # Then the re-check refuses it: no downstream call, the stable code for the
    # caller, and an audit decision that says it was the execution-time check
    assert outcome.label is OutcomeLabel.FAILED_TERMINAL
    assert bank.runs == []
    result = only_result(engine, "req-1")
    assert isinstance(result, FailedTerminal)
    assert (result.error.code, result.error.message) == ("business_rule_violation", "insufficient funds")
    assert terminal_decision(engine, operation_id) == (
        "started", "failed_terminal", "business_rule_violation_at_execution",
    )
    assert bank.balances["acc-1"] == 30_000


def test_check_at_execution__three_payments_over_the_balance__third_refused(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given three payments of 400.00 admitted one after another from 1,000.00
    ids = [admit_payment(engine, registry, 40_000, f"req-{n}")[0] for n in range(3)]

    # When they run
    outcomes = [runner.handle(operation_id).label for operation_id in ids]

    # Then two ran and the third was refused before its downstream call
    assert outcomes == [OutcomeLabel.SUCCEEDED, OutcomeLabel.SUCCEEDED, OutcomeLabel.FAILED_TERMINAL]
    assert bank.runs == ids[:2]
    assert bank.balances["acc-1"] == 20_000
    assert only_result(engine, "req-2").error.code == "business_rule_violation"


def test_check_at_execution__approved_call_whose_facts_changed__refused(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given a large payment, approved by bob while the balance covered it
    operation_id, approval_id = admit_payment(engine, registry, 60_000, "req-big")
    assert approval_id is not None
    with engine.begin() as conn:
        assert store.approve(conn, approval_id, approver=BOB, registry=registry).decided
    # ... then the balance is spent before it runs
    bank.balances["acc-1"] = 50_000

    runner.handle(operation_id)

    # Then the approval did not make stale facts true: refused, nothing ran
    assert bank.runs == []
    assert only_result(engine, "req-big").error.code == "business_rule_violation"
    assert terminal_decision(engine, operation_id)[2] == "business_rule_violation_at_execution"


def test_check_at_execution__check_raises__fails_closed_with_generic_message(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")
    bank.check_raises = KeyError("acc-1 secret internals")

    runner.handle(operation_id)

    assert bank.runs == []
    result = only_result(engine, "req-1")
    assert (result.error.code, result.error.message) == (
        "business_rule_violation", "the business rule check failed",
    )
    assert "secret" not in result.model_dump_json()


def test_check_at_execution__lost_database_connection__released_to_retry_not_refused(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")
    bank.check_raises = OperationalError("SELECT balance", {}, Exception("connection reset"))

    outcome = runner.handle(operation_id)

    # Nothing ran downstream, so trying again is safe whatever the effect contract
    assert_released_before_run(engine, outcome, bank, operation_id)


def assert_released_before_run(
    engine: Engine, outcome: Any, bank: Bank, operation_id: str
) -> None:
    """Given back to `retry_wait` before the handler ran (`released_before_run`)."""
    assert outcome.label is OutcomeLabel.RETRY_WAIT
    assert bank.runs == []
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
        assert row is not None and (row.state, row.error_code) == ("retry_wait", "upstream_unavailable")
        assert store.audit_trail(conn, operation_id)[-1].decision_code == store.RELEASED_BEFORE_RUN


# ------------------------------------------------------------------ access rule


@pytest.fixture
def directory(pg_url: str) -> Iterator[Directory]:
    """Down unless a test says `up`: the database a hook reads, while the worker re-checks."""
    found = Directory(up_url=pg_url, up=False)
    yield found
    found.dispose()


def released_then_runs_once(
    engine: Engine, runner: OperationRunner, bank: Bank, directory: Directory, operation_id: str
) -> None:
    """The worker re-checks while the directory refuses connections (a real refused
    connection): the hook decided nothing, so the operation is given back, not ended
    for good. Once the directory answers and the retry is due, the hook is asked
    again and the payment runs once."""
    assert_released_before_run(engine, runner.handle(operation_id), bank, operation_id)
    directory.up = True
    assert _promote_when_due(engine, operation_id)
    assert runner.handle(operation_id).label is OutcomeLabel.SUCCEEDED
    assert bank.runs == [operation_id] and bank.effects() == 1


def test_access_at_execution__rule_lost_its_database__released_to_retry_then_runs(
    engine: Engine, runner: OperationRunner, bank: Bank, directory: Directory,
) -> None:
    # Given a payment admitted while the directory its access rule reads was up
    registry = Registry([pay_tool(bank, LARGE, rule=directory.authorizes)])
    runner = OperationRunner(runner.settings, registry, engine)
    operation_id, _ = admit_payment_when_allowed(engine, registry, directory)

    released_then_runs_once(engine, runner, bank, directory, operation_id)
    assert only_result(engine, "req-1").status == "succeeded"


def test_access_at_execution__rule_raises_something_else__still_fails_closed(
    engine: Engine, runner: OperationRunner, bank: Bank
) -> None:
    broken = False

    def rule(args: PayArgs, ctx: ServerContext) -> bool:
        if broken:
            raise KeyError("acc-1 secret internals")
        return True

    registry = Registry([pay_tool(bank, LARGE, rule=rule)])
    runner = OperationRunner(runner.settings, registry, engine)
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")
    # Given a rule that breaks between admission and execution
    broken = True

    runner.handle(operation_id)

    # Not a connection error: the rule could not decide, and that denies
    assert bank.runs == []
    result = only_result(engine, "req-1")
    assert result.error.code == "permission_denied"
    assert "secret" not in result.model_dump_json()
    assert terminal_decision(engine, operation_id)[2] == "permission_denied_at_execution"


def admit_payment_when_allowed(
    engine: Engine, registry: Registry, directory: Directory
) -> tuple[str, str | None]:
    """Admit with the directory up (admission's hooks ask it too), then take it down."""
    directory.up = True
    try:
        return admit_payment(engine, registry, 100, "req-1")
    finally:
        directory.up = False


# ------------------------------------------------------------------ approval requirement


def test_approval_at_execution__policy_now_always__queued_call_ends_approval_required(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given a small payment admitted without approval
    operation_id, approval_id = admit_payment(engine, registry, 100, "req-1")
    assert approval_id is None
    # ... and the tool's policy changed to "always" before it ran
    registry.replace(pay_tool(bank, Approval.always()))

    runner.handle(operation_id)

    assert bank.runs == []
    result = only_result(engine, "req-1")
    assert isinstance(result, FailedTerminal)
    assert result.error.code == "approval_required"
    assert terminal_decision(engine, operation_id) == (
        "started", "failed_terminal", "approval_required_at_execution",
    )


def test_approval_at_execution__policy_now_always__approved_call_still_runs(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    operation_id, approval_id = admit_payment(engine, registry, 60_000, "req-big")
    assert approval_id is not None
    with engine.begin() as conn:
        assert store.approve(conn, approval_id, approver=BOB, registry=registry).decided
    registry.replace(pay_tool(bank, Approval.always()))

    runner.handle(operation_id)

    assert bank.runs == [operation_id]
    assert isinstance(only_result(engine, "req-big"), Succeeded)


def test_approval_at_execution__predicate_lost_its_database__released_to_retry_then_runs(
    engine: Engine, runner: OperationRunner, bank: Bank, directory: Directory,
) -> None:
    # Given a payment admitted without approval by a predicate that reads a database
    # ("approval when the directory says the account is under review"): not
    # approval_required for good when that database is down at the re-check
    registry = Registry([pay_tool(bank, Approval.when(lambda args, ctx: not directory.ask()))])
    runner = OperationRunner(runner.settings, registry, engine)
    operation_id, approval_id = admit_payment_when_allowed(engine, registry, directory)
    assert approval_id is None

    released_then_runs_once(engine, runner, bank, directory, operation_id)


def test_approval_at_execution__resources_hook_lost_its_database__released_to_retry_then_runs(
    engine: Engine, runner: OperationRunner, bank: Bank, directory: Directory,
) -> None:
    # Given an approved payment whose tool computes its resource set from a database
    # (the approval is bound to that set through the intent hash)
    def resources(args: PayArgs, ctx: ServerContext) -> list[str]:
        assert directory.ask()
        return [f"account:{args.account}"]

    def run(args: PayArgs, ctx: RunContext) -> Written:
        written = bank.run(args, ctx)
        return Written(written.output, written.receipt, changed_resources={f"account:{args.account}"})

    registry = Registry([Tool(
        name="bank.pay", description="pay from an account", mode=Mode.WRITE, untrusted_output=False,
        input_model=PayArgs, output_model=Paid, run=run, access=Access.for_roles("member"),
        approval=Approval.always(), approvers=ApproverPolicy.for_roles("approver"),
        effect=[Effect.FENCED], resources=resources,
    )])
    runner = OperationRunner(runner.settings, registry, engine)
    directory.up = True
    operation_id, approval_id = admit_payment(engine, registry, 100, "req-1")
    assert approval_id is not None
    with engine.begin() as conn:
        assert store.approve(conn, approval_id, approver=BOB, registry=registry).decided
    directory.up = False

    # Then a database down when the worker recomputes the set is not
    # approval_invalidated for good, and the approval still binds the same set after
    released_then_runs_once(engine, runner, bank, directory, operation_id)


# ------------------------------------------------------------------ current roles


def test_roles_at_execution__role_revoked_in_the_application__permission_denied_no_run(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given a payment admitted while alice is a member
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")
    # ... and the application has since taken her role away
    current: dict[str, Iterable[str]] = {"alice": ()}
    registry.set_role_resolver(lambda ctx: current[ctx.principal])

    runner.handle(operation_id)

    assert bank.runs == []
    assert only_result(engine, "req-1").error.code == "permission_denied"
    assert terminal_decision(engine, operation_id)[2] == "permission_denied_at_execution"


def test_roles_at_execution__resolver_answers__tool_runs_with_the_current_roles(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")
    registry.set_role_resolver(lambda ctx: ["member", "auditor"])

    runner.handle(operation_id)

    assert bank.runs == [operation_id]
    assert bank.seen_roles == [frozenset({"member", "auditor"})]


def test_roles_at_execution__resolver_raises__fails_closed_permission_denied(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")

    def broken_directory(ctx: ServerContext) -> list[str]:
        raise KeyError("directory internals")

    registry.set_role_resolver(broken_directory)

    runner.handle(operation_id)

    assert bank.runs == []
    result = only_result(engine, "req-1")
    assert result.error.code == "permission_denied"
    assert [d.code for d in result.error.details] == ["role_resolver_failed"]
    assert "directory" not in result.model_dump_json()


def test_roles_at_execution__resolver_lost_its_connection__released_to_retry_then_runs(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank, directory: Directory,
) -> None:
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")
    # Given the application's role resolver asks a directory (a real PostgreSQL server)
    registry.set_role_resolver(lambda ctx: ["member"] if directory.ask() else [])

    released_then_runs_once(engine, runner, bank, directory, operation_id)
    assert only_result(engine, "req-1").status == "succeeded"


# ------------------------------------------------------------------ after an earlier attempt


def first_attempt_applied_then_died(engine: Engine, bank: Bank, operation_id: str) -> None:
    """Generation 1 reserves, its handler applies the write downstream, and the worker
    dies before completing: the lease is already expired when it 'dies'."""
    with engine.begin() as conn:
        reservation = store.reserve(conn, operation_id, store.new_owner_token(), lease_seconds=-1.0)
    assert reservation is not None and reservation.generation == 1
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None
    args = PayArgs.model_validate_json(row.arguments)
    bank.run(args, RunContext(
        operation_id=operation_id, idempotency_key=f"toolfence:{operation_id}",
        fencing_token=1, deadline=0.0, server=ALICE, attempt=1, call_id=row.call_id,
    ))


def test_check_at_execution__takeover_after_the_first_attempt_applied__not_refused_by_its_own_effect(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given a payment of 450.00 from 800.00 whose first attempt applied it (the
    # balance is now 350.00) and whose worker died before completing
    bank.balances["acc-1"] = 80_000
    operation_id, _ = admit_payment(engine, registry, 45_000, "req-1")
    first_attempt_applied_then_died(engine, bank, operation_id)
    assert bank.balances["acc-1"] == 35_000

    # When a second worker takes the operation over
    outcome = runner.handle(operation_id)

    # Then the business rule is not re-run against facts the operation changed itself
    # (it would refuse: 350.00 < 450.00); the downstream's key dedupes the retry, and
    # the operation succeeds with the first attempt's receipt and one effect
    assert outcome.label is OutcomeLabel.SUCCEEDED
    assert bank.effects() == 1 and bank.balances["acc-1"] == 35_000
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None and (row.state, row.generation, row.receipt) == ("succeeded", 2, "r-1")


def test_access_at_execution__revoked_after_an_attempt_that_may_have_applied__reconciliation_pending(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given a payment whose first attempt may have applied it before its worker died
    operation_id, _ = admit_payment(engine, registry, 100, "req-1")
    first_attempt_applied_then_died(engine, bank, operation_id)
    # ... and alice's role revoked since
    registry.set_role_resolver(lambda ctx: [])

    outcome = runner.handle(operation_id)

    # Then the retry does not run (fail closed), and the operation is not ended
    # `failed_terminal` (its effect may exist): a person decides, told why
    assert outcome.label is OutcomeLabel.RECONCILIATION_PENDING
    assert bank.runs == [operation_id]  # only the first attempt's
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None and row.state == "reconciliation_pending"
    assert "permission_denied_at_execution" in (row.error or "")


def test_check_at_execution__released_before_run__the_next_generation_re_checks(
    engine: Engine, registry: Registry, runner: OperationRunner, bank: Bank
) -> None:
    # Given a payment whose first attempt gave it back before its handler ran
    # (the database was unreachable during the re-check)
    operation_id, _ = admit_payment(engine, registry, 40_000, "req-1")
    bank.check_raises = OperationalError("SELECT balance", {}, Exception("connection reset"))
    assert runner.handle(operation_id).label is OutcomeLabel.RETRY_WAIT
    with engine.connect() as conn:
        assert not store.earlier_attempt_may_have_run(conn, operation_id, 2)
    # ... and the balance spent before it is due again
    bank.check_raises = None
    bank.balances["acc-1"] = 30_000
    assert _promote_when_due(engine, operation_id)

    runner.handle(operation_id)

    # Then the second generation re-checks the rules: refused, nothing ran
    assert bank.runs == []
    assert only_result(engine, "req-1").error.code == "business_rule_violation"


def _promote_when_due(engine: Engine, operation_id: str, within: float = 10.0) -> bool:
    """retry_wait → queued once its backoff (a fraction of a second here) has passed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with engine.begin() as conn:
            if store.promote_due_retry(conn, operation_id):
                return True
        time.sleep(0.05)
    return False
