"""Tool declarations for the reference ledger: one write per effect contract, a read,
a batch write held to the set of accounts it was approved for (`send_notices`), and
the built-in sandboxed code tool (`sandbox.run_python`), opted in.

This module is what a tool author writes. `registry` is what `toolfence worker`
loads by default (`TOOLFENCE_TOOLS=ledger.tools:registry`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.exc import DBAPIError

from executor import (
    Access,
    Amount,
    Approval,
    ApproverPolicy,
    BusinessRuleViolation,
    Effect,
    ErrorCode,
    ErrorDetail,
    LookupAnswer,
    LookupResult,
    Mode,
    Registry,
    RunContext,
    ServerContext,
    TerminalError,
    Tool,
    ToolFailure,
    TurnSurface,
    Writes,
    Written,
    open_items,
    run_python_tool,
)
from executor.core.admission import REFUSED_BY_DATABASE
from executor.store.errors import refused_for_bad_data
from ledger.service import AccountNotFound, InsufficientFunds, OutsideApprovedSet, default_ledger

APPROVAL_THRESHOLD_CENTS = 50_000
# A notice batch to more accounts than this waits for a person, who sees the accounts.
NOTICE_BATCH_APPROVAL_THRESHOLD = 10
MAX_NOTICE_BATCH = 200
ACCOUNT = "account:"
CURRENCY = "USD"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AccountArgs(_Args):
    account_id: str = Field(min_length=1, max_length=64)


class CreditArgs(_Args):
    account_id: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0, le=10_000_000)
    memo: str = Field(default="", max_length=200)


class TransferArgs(_Args):
    source_account: str = Field(min_length=1, max_length=64)
    target_account: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0, le=10_000_000)


class InvoiceArgs(_Args):
    account_id: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0, le=10_000_000)


class NoticeArgs(_Args):
    account_id: str = Field(min_length=1, max_length=64)
    text: str = Field(min_length=1, max_length=500)


class NoticesArgs(_Args):
    account_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=MAX_NOTICE_BATCH
    )
    text: str = Field(min_length=1, max_length=500)

    @field_validator("account_ids")
    @classmethod
    def _each_account_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("each account at most once")
        return value


class Balance(BaseModel):
    account_id: str
    balance_cents: int


class Receipt(BaseModel):
    receipt: str
    applied: bool = True


class NoticeBatchReceipt(BaseModel):
    receipt: str
    applied: bool = True
    notices: int


def _owns_account(account_id: str, ctx: ServerContext) -> bool:
    """Authorization from the server context only: the account's tenant, looked up."""
    return default_ledger().account_tenant(account_id) == ctx.tenant


def _owns(args: Any, ctx: ServerContext) -> bool:
    return _owns_account(args.account_id, ctx)


def _owns_both(args: TransferArgs, ctx: ServerContext) -> bool:
    accounts = (args.source_account, args.target_account)
    tenants = default_ledger().account_tenants(accounts)  # one query for both
    return all(tenants.get(account_id) == ctx.tenant for account_id in accounts)


def _owns_all(args: NoticesArgs, ctx: ServerContext) -> bool:
    tenants = default_ledger().account_tenants(args.account_ids)
    return all(tenants.get(account_id) == ctx.tenant for account_id in args.account_ids)


def _sufficient_funds(args: TransferArgs, ctx: ServerContext) -> None:
    if args.source_account == args.target_account:
        raise BusinessRuleViolation("source and target must differ")
    if default_ledger().balance(args.source_account) < args.amount_cents:
        raise BusinessRuleViolation("insufficient funds")


def _transfer_impact(args: TransferArgs, ctx: ServerContext) -> dict[str, Any]:
    """Read on current state: the console recomputes it when a card is shown and when
    the decision is made (executor/core/impact.py)."""
    balance = default_ledger().balance(args.source_account)
    return {
        "summary": f"move {args.amount_cents / 100:.2f} from {args.source_account} "
        f"to {args.target_account}",
        "source_balance_cents": balance,
        "amount_cents": args.amount_cents,
        "source_balance_after_cents": balance - args.amount_cents,
    }


# How the console shows the impact's integers: cents of the ledger's currency.
TRANSFER_AMOUNTS = {
    name: Amount(CURRENCY, 2)
    for name in ("source_balance_cents", "amount_cents", "source_balance_after_cents")
}


def _resources_account(args: Any, ctx: ServerContext) -> list[str]:
    return [f"account:{args.account_id}"]


def _resources_transfer(args: TransferArgs, ctx: ServerContext) -> list[str]:
    return [f"account:{args.source_account}", f"account:{args.target_account}"]


def _resources_notices(args: NoticesArgs, ctx: ServerContext) -> list[str]:
    """The accounts a batch may change: what the approver sees and the ledger enforces."""
    return [ACCOUNT + account_id for account_id in args.account_ids]


def approved_accounts(ctx: RunContext) -> frozenset[str] | None:
    """The account ids in the operation's approved set (None: it was admitted without one)."""
    if ctx.approved_resources is None:
        return None
    return frozenset(
        r.removeprefix(ACCOUNT) for r in ctx.approved_resources if r.startswith(ACCOUNT)
    )


# ------------------------------------------------------------------ handlers

_A = TypeVar("_A", bound=BaseModel)


_Handler = Callable[[_A, RunContext], Written]


def _refused_values_did_nothing(handler: _Handler[_A]) -> _Handler[_A]:
    """A write whose value the ledger's database refused (a NUL character in text, a
    constraint: `refused_for_bad_data`, decision 0193) fails for good, and says it did
    nothing: each of the ledger's writes is one transaction, and the refused
    statement rolled it back. Without this the worker could not tell the refusal
    from a write that may have acted (an `unsafe` notice would go to a person)."""

    @functools.wraps(handler)
    def run(args: _A, ctx: RunContext) -> Written:
        try:
            return handler(args, ctx)
        except DBAPIError as exc:
            if not refused_for_bad_data(exc):
                raise
            raise ToolFailure(
                ErrorCode.INVALID_ARGUMENTS,
                "the ledger refused a value of this call; nothing was written",
                retryable=False, details=(REFUSED_BY_DATABASE,),
            ) from None

    return run


def _get_balance(args: AccountArgs, ctx: RunContext) -> Balance:
    try:
        return Balance(account_id=args.account_id, balance_cents=default_ledger().balance(args.account_id))
    except AccountNotFound:
        raise TerminalError("no such account") from None


@_refused_values_did_nothing
def _credit(args: CreditArgs, ctx: RunContext) -> Written:
    ctx.ensure_owner()
    try:
        applied = default_ledger().credit(
            key=ctx.idempotency_key, operation_id=ctx.operation_id, generation=ctx.fencing_token,
            account_id=args.account_id, amount_cents=args.amount_cents,
        )
    except AccountNotFound:
        raise TerminalError("no such account") from None
    return Written(Receipt(receipt=applied.receipt, applied=applied.applied), applied.receipt)


@_refused_values_did_nothing
def _transfer(args: TransferArgs, ctx: RunContext) -> Written:
    ctx.ensure_owner()
    try:
        applied = default_ledger().transfer(
            key=ctx.idempotency_key, operation_id=ctx.operation_id, token=ctx.fencing_token,
            source=args.source_account, target=args.target_account,
            amount_cents=args.amount_cents,
        )
    except AccountNotFound:
        raise TerminalError("no such account") from None
    except InsufficientFunds:
        # The ledger keeps its own invariant, in the effect's transaction: a balance
        # spent since the check (a concurrent transfer) refuses the write here.
        raise BusinessRuleViolation("insufficient funds") from None
    return Written(Receipt(receipt=applied.receipt, applied=applied.applied), applied.receipt)


@_refused_values_did_nothing
def _invoice(args: InvoiceArgs, ctx: RunContext) -> Written:
    ctx.ensure_owner()
    try:
        invoice_id = default_ledger().create_invoice(
            reference=ctx.idempotency_key, operation_id=ctx.operation_id,
            generation=ctx.fencing_token, account_id=args.account_id,
            amount_cents=args.amount_cents,
        )
    except AccountNotFound:
        raise TerminalError("no such account") from None
    return Written(Receipt(receipt=invoice_id), invoice_id)


def _invoice_lookup(args: InvoiceArgs, ctx: RunContext) -> LookupResult:
    # The fencing token closes the door on the attempt asked about (see find_invoice).
    invoice_id = default_ledger().find_invoice(ctx.idempotency_key, ctx.fencing_token)
    if invoice_id is None:
        return LookupResult(LookupAnswer.NOT_DONE)
    return LookupResult(LookupAnswer.DONE, Written(Receipt(receipt=invoice_id), invoice_id))


@_refused_values_did_nothing
def _notice(args: NoticeArgs, ctx: RunContext) -> Written:
    ctx.ensure_owner()
    notice_id = default_ledger().send_notice(
        operation_id=ctx.operation_id, generation=ctx.fencing_token, account_id=args.account_id,
        text=args.text,
    )
    return Written(Receipt(receipt=notice_id), notice_id)


def deliver_notices(account_ids: list[str], text: str, ctx: RunContext, *, enforce: bool) -> Written:
    """Send a batch through the ledger and report the accounts it changed.

    With `enforce` the ledger holds the batch to `ctx.approved_resources` in its own
    transaction; the test fleet's overreaching tool turns it off to play a
    downstream that does not, so the worker's check is what catches it.
    """
    ctx.ensure_owner()
    try:
        batch = default_ledger().send_notices(
            key=ctx.idempotency_key, operation_id=ctx.operation_id, generation=ctx.fencing_token,
            tenant=ctx.server.tenant, account_ids=account_ids, text=text,
            approved_accounts=approved_accounts(ctx) if enforce else None,
        )
    except AccountNotFound:
        raise TerminalError("no such account") from None
    except OutsideApprovedSet:
        raise ToolFailure(
            ErrorCode.APPROVAL_SCOPE_EXCEEDED,
            "the ledger refused notices to accounts outside the approved set; none was sent",
            retryable=False,
            details=(
                ErrorDetail(path="account_ids", code="outside_approved_set", expected="approved accounts"),
            ),
        ) from None
    return Written(
        NoticeBatchReceipt(receipt=batch.receipt, applied=batch.applied, notices=len(batch.account_ids)),
        batch.receipt,
        changed_resources=frozenset(ACCOUNT + account_id for account_id in batch.account_ids),
    )


@_refused_values_did_nothing
def _notices(args: NoticesArgs, ctx: RunContext) -> Written:
    return deliver_notices(args.account_ids, args.text, ctx, enforce=True)


MEMBERS = ("member",)
# Who may decide a large transfer: an approver of the same tenant, never its requester.
APPROVERS = ("approver",)

get_balance: Tool[AccountArgs] = Tool(
    name="ledger.get_balance",
    description="Read an account's balance in cents.",
    mode=Mode.READ,
    untrusted_output=False,
    input_model=AccountArgs,
    output_model=Balance,
    run=_get_balance,
    access=Access.for_roles(*MEMBERS, rule=_owns),
    approval=Approval.never(),
    resource_ids=_resources_account,
)

credit: Tool[CreditArgs] = Tool(
    name="ledger.credit",
    description="Credit an account. Safe to repeat: the ledger dedupes on the idempotency key.",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=CreditArgs,
    output_model=Receipt,
    run=_credit,
    access=Access.for_roles(*MEMBERS, rule=_owns),
    approval=Approval.never(),
    effect=[Effect.IDEMPOTENT],
    resource_ids=_resources_account,
)

transfer: Tool[TransferArgs] = Tool(
    name="ledger.transfer",
    description="Move money between two accounts of the tenant (fenced write).",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=TransferArgs,
    output_model=Receipt,
    run=_transfer,
    access=Access.for_roles(*MEMBERS, rule=_owns_both),
    approval=Approval.when(lambda args, ctx: args.amount_cents >= APPROVAL_THRESHOLD_CENTS),
    approvers=ApproverPolicy.for_roles(*APPROVERS),
    effect=[Effect.FENCED],
    check=_sufficient_funds,
    impact=_transfer_impact,
    amounts=TRANSFER_AMOUNTS,
    resource_ids=_resources_transfer,
)

create_invoice: Tool[InvoiceArgs] = Tool(
    name="ledger.create_invoice",
    description="Issue an invoice. Not deduplicated; the ledger can tell whether it happened.",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=InvoiceArgs,
    output_model=Receipt,
    run=_invoice,
    access=Access.for_roles(*MEMBERS, rule=_owns),
    approval=Approval.never(),
    effect=[Effect.LOOKUP],
    lookup=_invoice_lookup,
    resource_ids=_resources_account,
)

send_notice: Tool[NoticeArgs] = Tool(
    name="ledger.send_notice",
    description="Send a notice to an account holder. Never retried automatically.",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=NoticeArgs,
    output_model=Receipt,
    run=_notice,
    access=Access.for_roles(*MEMBERS, rule=_owns),
    approval=Approval.never(),
    effect=[Effect.UNSAFE],
    resource_ids=_resources_account,
)

send_notices: Tool[NoticesArgs] = Tool(
    name="ledger.send_notices",
    description="Send one notice to each of several accounts of the tenant.",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=NoticesArgs,
    output_model=NoticeBatchReceipt,
    run=_notices,
    access=Access.for_roles(*MEMBERS, rule=_owns_all),
    approval=Approval.when(
        lambda args, ctx: len(args.account_ids) > NOTICE_BATCH_APPROVAL_THRESHOLD
    ),
    approvers=ApproverPolicy.for_roles(*APPROVERS),
    effect=[Effect.IDEMPOTENT],
    resources=_resources_notices,
)

# Code execution, opted in: a member may run a short program in the sandbox
# (executor/sandbox; docs/tools.md §Code execution). It changes nothing outside its
# run, so it needs no approval here; a deployment that wants one says so.
run_python: Tool[Any] = run_python_tool(access=Access.for_roles(*MEMBERS))

registry = Registry([get_balance, credit, transfer, create_invoice, send_notice, send_notices, run_python])

# The chat surface: its turns may read balances and propose credits and transfers
# (not notices, not invoices); every write they propose becomes a card an approver
# decides, and the requester's open items are listed to the model by number.
registry.add_surface(TurnSurface(
    "chat",
    tools=frozenset({"ledger.get_balance", "ledger.credit", "ledger.transfer"}),
    writes=Writes.APPROVAL,
    approvers=ApproverPolicy.for_roles(*APPROVERS),
    targets=open_items(),
))
