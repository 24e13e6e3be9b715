"""Approved set = changed set, on SQLite and PostgreSQL, with the real ledger.

A write declaring `resources` is admitted for that set of resource ids (shown to
the approver, recorded on the operation, handed to the handler as
`ctx.approved_resources`) and must report what it changed. The runner is driven
in-process here (`OperationRunner.handle`, a real heartbeat, the real store and
ledger); tests/fleet/test_fleet_approval_scope.py does the same with worker
processes on PostgreSQL.

The outcomes:

- changed ⊆ approved → `succeeded`;
- changed ⊄ approved, the downstream let it through → `reconciliation_pending`,
  error code `approval_scope_exceeded`, both sets recorded (bounded), the receipt
  recorded, the counter incremented;
- the downstream enforces the set → it refuses the whole batch in the effect's
  transaction: `failed_terminal` `approval_scope_exceeded`, nothing sent;
- no `changed_resources` reported → `invalid_result` (the receipt still recorded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import Field
from sqlalchemy import Engine, select

from executor import store
from executor.cli.main import main
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    LookupAnswer,
    LookupResult,
    Mode,
    Registry,
    RunContext,
    Tool,
    Written,
)
from executor.core.types import ErrorCode, Pending, ProposedCall, ServerContext
from executor.settings import Settings
from executor.store import engine as store_engine
from executor.store.schema import receipts
from executor.worker.outcomes import OutcomeLabel
from executor.worker.runner import OperationRunner
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger
from outbox.producer import EnqueueHandle, enqueue
from outbox.results import results
from reconciler.sweep import Reconciler

ALICE = ServerContext(
    principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-scope"
)
ACCOUNTS = [f"acme-{n:02d}" for n in range(60)]
FIFTY = ACCOUNTS[:50]
EXTRA = ACCOUNTS[50]


class OverreachingArgs(ledger_tools.NoticesArgs):
    also_account: str = Field(min_length=1, max_length=64)
    enforce: bool


def _overreach(args: OverreachingArgs, ctx: RunContext) -> Written:
    return ledger_tools.deliver_notices(
        [*args.account_ids, args.also_account], args.text, ctx, enforce=args.enforce
    )


def _silent(args: ledger_tools.NoticesArgs, ctx: RunContext) -> Written:
    written = ledger_tools.deliver_notices(args.account_ids, args.text, ctx, enforce=True)
    return Written(written.output, written.receipt)  # forgets to say what it changed


def _notices_tool(name: str, input_model: Any, run: Callable[..., Written]) -> Tool[Any]:
    return Tool(
        name=name, description="notices", mode=Mode.WRITE, input_model=input_model,
        untrusted_output=False,
        output_model=ledger_tools.NoticeBatchReceipt, run=run,
        access=Access.for_roles("member"), approval=Approval.never(),
        effect=[Effect.IDEMPOTENT], resources=ledger_tools._resources_notices,
    )


def _never_runs(args: Any, ctx: RunContext) -> Written:
    raise AssertionError("these tests settle the operation through its lookup")


def _lookup_reports(args: OverreachingArgs, ctx: RunContext) -> LookupResult:
    """The downstream's answer: done, and it changed the accounts plus `also_account`."""
    changed = [*args.account_ids, args.also_account] if not args.enforce else args.account_ids
    return LookupResult(
        LookupAnswer.DONE,
        Written(
            ledger_tools.NoticeBatchReceipt(receipt="nb_lookup", notices=len(changed)),
            "nb_lookup", changed_resources=frozenset(f"account:{a}" for a in changed),
        ),
    )


REGISTRY_UNDER_TEST = Registry([
    ledger_tools.send_notices,
    _notices_tool("test.overreaching_notices", OverreachingArgs, _overreach),
    _notices_tool("test.silent_notices", ledger_tools.NoticesArgs, _silent),
    Tool(
        name="test.looked_up_notices", description="notices settled by lookup", mode=Mode.WRITE,
        untrusted_output=False,
        input_model=OverreachingArgs, output_model=ledger_tools.NoticeBatchReceipt,
        run=_never_runs, access=Access.for_roles("member"), approval=Approval.never(),
        effect=[Effect.LOOKUP], lookup=_lookup_reports, resources=ledger_tools._resources_notices,
    ),
])


@pytest.fixture
def ledger(db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    book = Ledger(db_url)
    monkeypatch.setattr(ledger_service, "_default", book)
    book.create_schema()
    for account_id in ACCOUNTS:
        book.open_account(account_id, "acme", 0)
    book.open_account("globex-1", "globex", 0)
    yield book
    book.engine.dispose()


@pytest.fixture
def runner(db_url: str, engine: Engine) -> OperationRunner:
    settings = Settings(database_url=db_url, broker_url="memory://", lease_seconds=5.0)
    return OperationRunner(settings, REGISTRY_UNDER_TEST, engine)


# Another member of alice's tenant, with the approver role: the ledger's approver policy.
BOB = ServerContext(principal="bob", tenant="acme", roles=frozenset({"approver"}), request_id="approval")


def enqueue_one(engine: Engine, tool_name: str, **arguments: object) -> EnqueueHandle:
    call = ProposedCall(call_id="c1", tool_name=tool_name, arguments=json.dumps(arguments))
    with engine.begin() as conn:
        return enqueue(conn, [call], ALICE, REGISTRY_UNDER_TEST)


def operation(engine: Engine, operation_id: str) -> store.OperationRow:
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None
    return row


def receipts_of(engine: Engine, operation_id: str) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(receipts.c.receipt).where(receipts.c.operation_id == operation_id)
            ).scalars()
        )


def scope_exceeded_count(tool_name: str) -> float:
    value = REGISTRY.get_sample_value("toolfence_approval_scope_exceeded_total", {"tool": tool_name})
    return value or 0.0


def test_send_notices__fifty_approved_fifty_sent__succeeded_and_approver_saw_the_accounts(
    engine: Engine, ledger: Ledger, runner: OperationRunner
) -> None:
    # Given a batch of 50 notices: above the threshold, so a person must approve it
    handle = enqueue_one(engine, "ledger.send_notices", account_ids=FIFTY, text="maintenance")
    (call,) = handle.calls
    assert isinstance(call.status, Pending) and call.status.impact is not None
    # ... and the approver is shown the server's set of accounts, not the model's words
    assert call.status.impact["resources"] == sorted(f"account:{a}" for a in FIFTY)
    assert call.status.impact["resource_count"] == 50
    assert call.operation_id is not None and call.status.approval_id is not None
    with engine.begin() as conn:
        decision = store.approve(
            conn, call.status.approval_id, approver=BOB, registry=REGISTRY_UNDER_TEST
        )
        assert decision.decided

    # When a worker runs it
    outcome = runner.handle(call.operation_id)

    # Then it succeeded, 50 notices were sent, one receipt recorded
    assert outcome.label is OutcomeLabel.SUCCEEDED
    row = operation(engine, call.operation_id)
    assert json.loads(row.approved_resources or "null") == sorted(f"account:{a}" for a in FIFTY)
    assert ledger.notices_of_operation(call.operation_id) == sorted(FIFTY)
    assert len(set(receipts_of(engine, call.operation_id))) == 1
    assert [s.status for s in results(engine, ALICE)] == ["succeeded"]


def test_handler_changes_fifty_one_of_fifty_approved__reconciliation_pending_with_both_sets(
    engine: Engine, ledger: Ledger, runner: OperationRunner, db_url: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a write approved for 50 accounts whose handler also notifies a 51st,
    # through a downstream that does not enforce the approved set
    handle = enqueue_one(
        engine, "test.overreaching_notices", account_ids=FIFTY, text="hi", also_account=EXTRA,
        enforce=False,
    )
    operation_id = handle.operation_ids["c1"]
    before = scope_exceeded_count("test.overreaching_notices")

    # When a worker runs it
    outcome = runner.handle(operation_id)

    # Then the effect happened (51 notices) and its receipt is recorded (I1 counts it)
    assert ledger.notices_of_operation(operation_id) == sorted([*FIFTY, EXTRA])
    row = operation(engine, operation_id)
    assert row.receipt is not None and receipts_of(engine, operation_id) == [row.receipt]
    # ... but it is not `succeeded`: it waits for a person, with the cause
    assert outcome.label is OutcomeLabel.RECONCILIATION_PENDING
    assert (row.state, row.error_code) == ("reconciliation_pending", "approval_scope_exceeded")
    error = json.loads(row.error or "{}")
    assert error["cause"] == "approval_scope_exceeded"
    assert error["approved_resources"] == {
        "ids": sorted(f"account:{a}" for a in FIFTY), "count": 50, "omitted": 0,
    }
    assert error["changed_resources"]["count"] == 51
    assert error["outside_approved"] == {"ids": [f"account:{EXTRA}"], "count": 1, "omitted": 0}
    with engine.connect() as conn:
        trail = store.audit_trail(conn, operation_id)
    assert [(e.to_state, e.decision_code) for e in trail][-1] == (
        "reconciliation_pending", "approval_scope_exceeded",
    )
    assert scope_exceeded_count("test.overreaching_notices") == before + 1
    # ... the caller is told a person will check it, and nothing about the sets
    (status,) = results(engine, ALICE)
    assert isinstance(status, Pending) and status.state == "reconciliation_pending"
    assert status.impact is None
    # ... and the operator's commands show the cause
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.setattr(store_engine, "_engines", {})
    assert main(["pending"]) == 0
    (pending,) = json.loads(capsys.readouterr().out)
    assert (pending["operation_id"], pending["cause"]) == (operation_id, "approval_scope_exceeded")
    assert main(["show", operation_id, "--tenant", "acme"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["cause"] == "approval_scope_exceeded"
    assert shown["error"]["outside_approved"]["ids"] == [f"account:{EXTRA}"]


def test_downstream_enforces_approved_set__refuses_the_batch__failed_terminal_nothing_sent(
    engine: Engine, ledger: Ledger, runner: OperationRunner
) -> None:
    # Given the same overreaching handler, through the ledger that enforces the set
    handle = enqueue_one(
        engine, "test.overreaching_notices", account_ids=FIFTY, text="hi", also_account=EXTRA,
        enforce=True,
    )
    operation_id = handle.operation_ids["c1"]
    before = scope_exceeded_count("test.overreaching_notices")

    # When a worker runs it
    outcome = runner.handle(operation_id)

    # Then the ledger refused the whole batch in its own transaction: nothing was
    # sent, no receipt, and the call fails with the cause (the model may propose again)
    assert outcome.label is OutcomeLabel.FAILED_TERMINAL
    assert ledger.notices_of_operation(operation_id) == []
    assert receipts_of(engine, operation_id) == []
    (status,) = results(engine, ALICE)
    assert status.status == "failed_terminal"
    assert status.error.code is ErrorCode.APPROVAL_SCOPE_EXCEEDED  # type: ignore[union-attr]
    assert [d.code for d in status.error.details] == ["outside_approved_set"]  # type: ignore[union-attr]
    assert EXTRA not in json.dumps(status.model_dump(mode="json"))
    # ... and no excess happened, so none is counted
    assert scope_exceeded_count("test.overreaching_notices") == before


def test_write_declaring_resources_reports_no_changed_set__invalid_result_receipt_kept(
    engine: Engine, ledger: Ledger, runner: OperationRunner
) -> None:
    # Given a write that declares its resources but does not report what it changed
    handle = enqueue_one(engine, "test.silent_notices", account_ids=FIFTY[:3], text="hi")
    operation_id = handle.operation_ids["c1"]

    # When a worker runs it
    outcome = runner.handle(operation_id)

    # Then it is not succeeded: `invalid_result`, and the effect's receipt is recorded
    assert outcome.label is OutcomeLabel.FAILED_TERMINAL
    row = operation(engine, operation_id)
    assert (row.state, row.error_code) == ("failed_terminal", "invalid_result")
    assert ledger.notices_of_operation(operation_id) == sorted(FIFTY[:3])
    assert row.receipt is not None and receipts_of(engine, operation_id) == [row.receipt]


def test_send_notices__account_of_another_tenant__denied_at_admission_nothing_stored(
    engine: Engine, ledger: Ledger
) -> None:
    # Given a batch naming one account of another tenant
    handle = enqueue_one(
        engine, "ledger.send_notices", account_ids=[FIFTY[0], "globex-1"], text="hi"
    )

    # Then authorization refuses it before anything runs
    (call,) = handle.calls
    assert call.operation_id is None
    assert call.status.status == "failed_terminal"
    assert call.status.error.code is ErrorCode.PERMISSION_DENIED  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("within_scope", "settled_as"), [(True, "succeeded"), (False, "reconciliation_pending")]
)
def test_reconciler_lookup__answer_changed_beyond_approved_set__never_succeeded(
    engine: Engine, ledger: Ledger, db_url: str, within_scope: bool, settled_as: str
) -> None:
    # Given a `lookup` write whose worker vanished after reserving it (lease over)
    handle = enqueue_one(
        engine, "test.looked_up_notices", account_ids=FIFTY[:3], text="hi", also_account=EXTRA,
        enforce=within_scope,
    )
    operation_id = handle.operation_ids["c1"]
    with engine.begin() as conn:
        assert store.reserve(conn, operation_id, store.new_owner_token(), lease_seconds=-1.0)

    # When the reconciler asks the downstream, which says it is done and what it changed
    settings = Settings(database_url=db_url, broker_url="memory://")
    Reconciler(settings, engine, REGISTRY_UNDER_TEST).sweep()

    # Then it is recorded as succeeded only when the changed set is within the approved one
    row = operation(engine, operation_id)
    assert row.state == settled_as
    if not within_scope:
        assert json.loads(row.error or "{}")["message"] == "approval_scope_exceeded"


def test_mark_scope_exceeded__stale_owner__changes_nothing_current_owner_wins(
    engine: Engine, ledger: Ledger
) -> None:
    # Given an operation reserved by an owner whose lease expired, then taken over
    handle = enqueue_one(engine, "test.silent_notices", account_ids=FIFTY[:2], text="hi")
    operation_id = handle.operation_ids["c1"]
    with engine.begin() as conn:
        stale = store.reserve(conn, operation_id, store.new_owner_token(), lease_seconds=-1.0)
        assert stale is not None
        current = store.take_over(conn, operation_id, store.new_owner_token(), lease_seconds=30.0)
        assert current is not None
    error = {"cause": "approval_scope_exceeded", "message": "beyond"}

    # When the stale owner, then the current one, record an excess
    with engine.begin() as conn:
        stale_won = store.mark_scope_exceeded(
            conn, operation_id, stale.generation, owner_token=stale.owner_token,
            receipt="r-stale", error=error,
        )
    after_stale = operation(engine, operation_id)
    with engine.begin() as conn:
        current_won = store.mark_scope_exceeded(
            conn, operation_id, current.generation, owner_token=current.owner_token,
            receipt="r-current", error=error,
        )

    # Then only the current owner's CAS matched
    assert (stale_won, after_stale.state) == (False, "started")
    assert current_won
    row = operation(engine, operation_id)
    assert (row.state, row.error_code, row.receipt, row.owner_token) == (
        "reconciliation_pending", "approval_scope_exceeded", "r-current", None,
    )
