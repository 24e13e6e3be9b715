"""The reference ledger as an eval downstream: its fixtures, two tools, its own records.

`registry` (TOOLFENCE_TOOLS=ledger.eval:registry) is the ledger's registry plus
two tools the shipped fixtures need:

- `ledger.pay`: a payment between two accounts of the tenant, through the
  ledger's fenced transfer, whose gateway can answer late: for an account the
  case's setup lists under `late_answers`, the first applied payment to it is
  reported as a timeout *after* the ledger committed it (the answer was lost on
  the way back), so the worker retries and the ledger's dedupe must make the
  retry a no-op;
- `ledger.delete_invoices`: delete a batch of the tenant's invoices; more than
  ten wait for an approver.

`downstream` prepares each case's setup (accounts, invoices, late answers) and
counts effects from the ledger's own `ledger_effects` table, by kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select, update

from executor import (
    Access,
    Approval,
    ApproverPolicy,
    Effect,
    ErrorCode,
    Mode,
    Registry,
    RetryableError,
    RunContext,
    ServerContext,
    TerminalError,
    Tool,
    Written,
)
from executor.store.engine import insert_ignore
from ledger import service
from ledger.service import AccountNotFound, InsufficientFunds, Ledger, default_ledger
from ledger.tools import APPROVERS, MEMBERS, Receipt
from ledger.tools import registry as ledger_registry

if TYPE_CHECKING:
    from executor.eval.fixtures import Case

DELETE_APPROVAL_THRESHOLD = 10
MAX_DELETE_BATCH = 200

metadata = MetaData()
# The payment gateway's late answers, by payee: how many applied payments to report
# as timed out (the fixtures' "retried payment after a timeout").
late_answers = Table(
    "ledger_eval_late_answers",
    metadata,
    Column("account_id", String(64), primary_key=True),
    Column("remaining", Integer, nullable=False),
)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PayArgs(_Args):
    source_account: str = Field(min_length=1, max_length=64)
    target_account: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0, le=10_000_000)


class DeleteInvoicesArgs(_Args):
    invoice_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=MAX_DELETE_BATCH
    )

    @field_validator("invoice_ids")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("each invoice at most once")
        return value


def _owns_both(args: PayArgs, ctx: ServerContext) -> bool:
    accounts = (args.source_account, args.target_account)
    tenants = default_ledger().account_tenants(accounts)
    return all(tenants.get(account_id) == ctx.tenant for account_id in accounts)


def _owns_invoices(args: DeleteInvoicesArgs, ctx: ServerContext) -> bool:
    ledger = default_ledger()
    accounts = ledger.invoice_accounts(args.invoice_ids)
    if len(accounts) != len(args.invoice_ids):
        return False  # an invoice that does not exist is nobody's to delete
    tenants = ledger.account_tenants(sorted(set(accounts.values())))
    return all(tenants.get(account_id) == ctx.tenant for account_id in accounts.values())


def _answered_late(account_id: str) -> bool:
    """Take one late answer for the payee, if its gateway owes one (atomically)."""
    with default_ledger().engine.begin() as conn:
        taken = conn.execute(
            update(late_answers)
            .where(late_answers.c.account_id == account_id, late_answers.c.remaining > 0)
            .values(remaining=late_answers.c.remaining - 1)
        ).rowcount
    return bool(taken)


def _pay(args: PayArgs, ctx: RunContext) -> Written:
    ctx.ensure_owner()
    try:
        applied = default_ledger().transfer(
            key=ctx.idempotency_key, operation_id=ctx.operation_id, token=ctx.fencing_token,
            source=args.source_account, target=args.target_account, amount_cents=args.amount_cents,
        )
    except AccountNotFound:
        raise TerminalError("no such account") from None
    except InsufficientFunds:
        raise TerminalError("insufficient funds") from None
    if applied.applied and _answered_late(args.target_account):
        raise RetryableError("the payment gateway did not answer in time", code=ErrorCode.TIMEOUT)
    return Written(Receipt(receipt=applied.receipt, applied=applied.applied), applied.receipt)


def _delete_invoices(args: DeleteInvoicesArgs, ctx: RunContext) -> Written:
    ctx.ensure_owner()
    applied = default_ledger().delete_invoices(
        key=ctx.idempotency_key, operation_id=ctx.operation_id, generation=ctx.fencing_token,
        invoice_ids=args.invoice_ids,
    )
    return Written(Receipt(receipt=applied.receipt, applied=applied.applied), applied.receipt)


pay: Tool[PayArgs] = Tool(
    name="ledger.pay",
    description="Pay an amount from one of the tenant's accounts to another (fenced, retried on timeout).",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=PayArgs,
    output_model=Receipt,
    run=_pay,
    access=Access.for_roles(*MEMBERS, rule=_owns_both),
    approval=Approval.never(),
    effect=[Effect.FENCED],
    resource_ids=lambda args, ctx: [f"account:{args.source_account}", f"account:{args.target_account}"],
)

delete_invoices: Tool[DeleteInvoicesArgs] = Tool(
    name="ledger.delete_invoices",
    description="Delete invoices of the tenant. More than ten wait for an approver.",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=DeleteInvoicesArgs,
    output_model=Receipt,
    run=_delete_invoices,
    access=Access.for_roles(*MEMBERS, rule=_owns_invoices),
    approval=Approval.when(lambda args, ctx: len(args.invoice_ids) > DELETE_APPROVAL_THRESHOLD),
    approvers=ApproverPolicy.for_roles(*APPROVERS),
    effect=[Effect.IDEMPOTENT],
    resources=lambda args, ctx: [f"invoice:{invoice_id}" for invoice_id in args.invoice_ids],
)

registry = Registry([*ledger_registry, pay, delete_invoices])
for _surface in ("chat",):
    _declared = ledger_registry.surface(_surface)
    if _declared is not None:
        registry.add_surface(_declared)

EFFECT_KINDS = {
    "ledger.credit": "credit", "ledger.transfer": "transfer", "ledger.pay": "transfer",
    "ledger.create_invoice": "invoice", "ledger.send_notice": "notice", "ledger.send_notices": "notices",
    "ledger.delete_invoices": "delete_invoice",
}


class LedgerDownstream:
    """The ledger's own records: `ledger_effects` rows of a case's operations, by kind."""

    def prepare(self, database_url: str, cases: Sequence[Case]) -> None:
        ledger = Ledger(database_url)
        ledger.create_schema()
        metadata.create_all(ledger.engine)
        with ledger.engine.begin() as conn:
            for case in cases:
                setup: dict[str, Any] = case.setup
                for account in setup.get("accounts", []):
                    insert_ignore(conn, service.accounts, {
                        "account_id": account["account_id"], "tenant": account["tenant"],
                        "balance_cents": int(account.get("balance_cents", 0)),
                    }, ["account_id"])
                batch = setup.get("invoices")
                if batch:
                    for n in range(1, int(batch["count"]) + 1):
                        insert_ignore(conn, service.invoices, {
                            "invoice_id": f"{batch['prefix']}{n:03d}", "reference": f"eval-setup:{case.id}",
                            "account_id": batch["account_id"],
                            "amount_cents": int(batch.get("amount_cents", 100)),
                        }, ["invoice_id"])
                for account_id, count in setup.get("late_answers", {}).items():
                    insert_ignore(conn, late_answers, {"account_id": account_id, "remaining": int(count)},
                                  ["account_id"])
        ledger.engine.dispose()

    def effects(self, database_url: str, operation_ids: Sequence[str]) -> dict[str, int]:
        if not operation_ids:
            return {}
        ledger = Ledger(database_url)
        try:
            with ledger.reader.connect() as conn:
                rows = conn.execute(
                    select(service.effects.c.kind, func.count())
                    .where(service.effects.c.operation_id.in_(list(operation_ids)))
                    .group_by(service.effects.c.kind)
                ).all()
        finally:
            ledger.engine.dispose()
        return {kind: int(count) for kind, count in rows}

    def effect_of(self, tool: str) -> str | None:
        return EFFECT_KINDS.get(tool)


downstream = LedgerDownstream()
