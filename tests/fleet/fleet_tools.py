"""The tool registry the test fleet's workers load (`TOOLFENCE_TOOLS=fleet_tools:registry`).

The reference ledger's tools, unchanged in behaviour, plus what the fleet tests
need to observe and steer a worker subprocess from the outside:

- every handler invocation is recorded in `fleet_invocations` (operation id,
  generation, pid) *before* the handler runs, so a test counts invocations per
  operation from the database, including those of a process it killed;
- every tool's access rule also consults a policy file
  (`TOOLFENCE_TEST_POLICY_FILE`, JSON `{"revoked": {tool: [principal, ...]}}`),
  read on each check, so a test can revoke a permission after admission and
  the worker sees it;
- `test.slow_balance`, a read with a per-call delay (overlap, completion order);
- `test.flaky_credit`, an idempotent write whose downstream fails its first
  `fail_times` invocations, retryably or terminally;
- `test.overreaching_notices`, a notice batch approved for `account_ids` whose
  handler also notifies `also_account`, through a ledger that enforces the
  approved set (`enforce=true`) or one that does not.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, func, insert, select

from executor.core.approvers import ApproverPolicy
from executor.core.surfaces import TurnSurface, Writes
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    Mode,
    Registry,
    RetryableError,
    RetryPolicy,
    RunContext,
    TerminalError,
    Tool,
    Written,
)
from executor.core.types import ServerContext
from executor.store.clock import db_now
from executor.store.schema import Id
from executor.turns.targets import open_items
from ledger import tools as ledger_tools
from ledger.service import AccountNotFound, default_ledger

POLICY_FILE_ENV = "TOOLFENCE_TEST_POLICY_FILE"
FLAKY_RETRY = RetryPolicy(max_attempts=3, initial_backoff_seconds=0.5, max_backoff_seconds=2.0)

metadata = MetaData()

invocations = Table(
    "fleet_invocations",
    metadata,
    Column("invocation_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", Float, nullable=False),
)


def create_schema(engine: Any) -> None:
    metadata.create_all(engine)


# ------------------------------------------------------------------ policy


def revoked_principals(tool_name: str) -> frozenset[str]:
    path = os.environ.get(POLICY_FILE_ENV)
    if not path or not Path(path).exists():
        return frozenset()
    policy = json.loads(Path(path).read_text())
    return frozenset(policy.get("revoked", {}).get(tool_name, ()))


def write_policy(path: Path, revoked: dict[str, list[str]]) -> None:
    """Replace the policy atomically: a reader never sees half a file."""
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps({"revoked": revoked}))
    staging.replace(path)


def _with_policy(tool_name: str, access: Access) -> Access:
    def rule(args: Any, ctx: ServerContext) -> bool:
        if ctx.principal in revoked_principals(tool_name):
            return False
        return access.authorizes(args, ctx)

    return Access(roles=access.roles, rule=rule, public=access.public)


# ------------------------------------------------------------------ invocations


def _record_invocation(tool_name: str, ctx: RunContext) -> None:
    with default_ledger().engine.begin() as conn:
        conn.execute(
            insert(invocations).values(
                operation_id=ctx.operation_id, tool_name=tool_name, generation=ctx.fencing_token,
                pid=os.getpid(), at=db_now(),
            )
        )


def invocation_count(operation_id: str) -> int:
    with default_ledger().reader.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(invocations)
                .where(invocations.c.operation_id == operation_id)
            ).scalar_one()
        )


def _counted(tool_name: str, run: Any) -> Any:
    def counted_run(args: Any, ctx: RunContext) -> Any:
        _record_invocation(tool_name, ctx)
        return run(args, ctx)

    return counted_run


def _instrumented(tool: Tool[Any]) -> Tool[Any]:
    """The same declaration, with its run counted and its access under the policy file."""
    return Tool(**_declaration(tool))


def _declaration(tool: Tool[Any]) -> dict[str, Any]:
    declaration: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "mode": tool.mode,
        "input_model": tool.input_model,
        "output_model": tool.output_model,
        "run": _counted(tool.name, tool.run),
        "access": _with_policy(tool.name, tool.access),
        "approval": tool.approval,
        "approvers": tool.approvers,
        "schema_version": tool.schema_version,
        "check": tool.check,
        "impact": tool.impact,
        "amounts": tool.amounts,
        "lookup": tool.lookup,
        "model_view": tool.model_view,
        "render_view": tool.render_view,
        "resource_ids": tool.resource_ids,
        "resources": tool.resources,
        "untrusted_output": tool.untrusted_output,
        "retry": tool.retry,
        "retryable_exceptions": tool.retryable_exceptions,
        "timeout_seconds": tool.timeout_seconds,
        "listed": tool.listed,
    }
    if tool.mode is Mode.WRITE:
        declaration["effect"] = sorted(tool.effects)
    return declaration


# ------------------------------------------------------------------ test tools


class SlowAccountArgs(ledger_tools.AccountArgs):
    delay_ms: int = Field(ge=0, le=10_000)


def _slow_balance(args: SlowAccountArgs, ctx: RunContext) -> ledger_tools.Balance:
    time.sleep(args.delay_ms / 1000.0)
    try:
        balance = default_ledger().balance(args.account_id)
    except AccountNotFound:
        raise TerminalError("no such account") from None
    return ledger_tools.Balance(account_id=args.account_id, balance_cents=balance)


class FlakyCreditArgs(ledger_tools.CreditArgs):
    fail_times: int = Field(ge=0, le=100)
    failure: Literal["retryable", "terminal"] = "retryable"


def _flaky_credit(args: FlakyCreditArgs, ctx: RunContext) -> Written:
    # This invocation is already recorded: the first `fail_times` of them fail.
    if invocation_count(ctx.operation_id) <= args.fail_times:
        if args.failure == "terminal":
            raise TerminalError("the downstream refused the credit")
        raise RetryableError("the downstream is unavailable")
    ctx.ensure_owner()
    applied = default_ledger().credit(
        key=ctx.idempotency_key, operation_id=ctx.operation_id, generation=ctx.fencing_token,
        account_id=args.account_id, amount_cents=args.amount_cents,
    )
    return Written(
        ledger_tools.Receipt(receipt=applied.receipt, applied=applied.applied), applied.receipt
    )


class OverreachingNoticesArgs(ledger_tools.NoticesArgs):
    also_account: str = Field(min_length=1, max_length=64)
    enforce: bool


def _overreaching_notices(args: OverreachingNoticesArgs, ctx: RunContext) -> Written:
    # Sends to one account more than it declared (and was approved for), and reports
    # honestly what it changed.
    return ledger_tools.deliver_notices(
        [*args.account_ids, args.also_account], args.text, ctx, enforce=args.enforce
    )


def _owns_all_and_extra(args: OverreachingNoticesArgs, ctx: ServerContext) -> bool:
    return ledger_tools._owns_all(args, ctx) and ledger_tools._owns_account(args.also_account, ctx)


slow_balance: Tool[SlowAccountArgs] = Tool(
    name="test.slow_balance",
    description="Read an account's balance after a delay.",
    mode=Mode.READ,
    untrusted_output=False,
    input_model=SlowAccountArgs,
    output_model=ledger_tools.Balance,
    run=_slow_balance,
    access=Access.for_roles(*ledger_tools.MEMBERS, rule=ledger_tools._owns),
    approval=Approval.never(),
)

flaky_credit: Tool[FlakyCreditArgs] = Tool(
    name="test.flaky_credit",
    description="Credit an account through a downstream that fails its first calls.",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=FlakyCreditArgs,
    output_model=ledger_tools.Receipt,
    run=_flaky_credit,
    access=Access.for_roles(*ledger_tools.MEMBERS, rule=ledger_tools._owns),
    approval=Approval.never(),
    effect=[Effect.IDEMPOTENT],
    retry=FLAKY_RETRY,
)

overreaching_notices: Tool[OverreachingNoticesArgs] = Tool(
    name="test.overreaching_notices",
    description="Send notices to the given accounts, and to one more.",
    mode=Mode.WRITE,
    untrusted_output=False,
    input_model=OverreachingNoticesArgs,
    output_model=ledger_tools.NoticeBatchReceipt,
    run=_overreaching_notices,
    access=Access.for_roles(*ledger_tools.MEMBERS, rule=_owns_all_and_extra),
    approval=Approval.never(),
    effect=[Effect.IDEMPOTENT],
    resources=ledger_tools._resources_notices,
)

class OperationArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    operation_id: str = Field(min_length=1, max_length=200)


class Described(BaseModel):
    operation_id: str


describe_operation: Tool[OperationArgs] = Tool(
    name="test.describe_operation",
    description="Describe one of the requester's listed operations (its id from the list).",
    mode=Mode.READ,
    untrusted_output=False,
    input_model=OperationArgs,
    output_model=Described,
    run=lambda args, ctx: Described(operation_id=args.operation_id),
    access=Access.for_roles(*ledger_tools.MEMBERS),
    approval=Approval.never(),
    listed=["operation_id"],
)

registry = Registry(
    _instrumented(tool)
    for tool in (*ledger_tools.registry, slow_balance, flaky_credit, overreaching_notices)
)
registry.add(_instrumented(describe_operation))
# A chat surface (tests/fleet/test_fleet_turn_surfaces.py): reads and writes of the
# ledger, a write becomes a card an approver decides; not ledger.send_notice.
CHAT_CATALOG = frozenset({
    "ledger.get_balance", "ledger.credit", "ledger.transfer", "test.describe_operation",
})
registry.add_surface(TurnSurface(
    "chat", tools=CHAT_CATALOG, writes=Writes.APPROVAL,
    approvers=ApproverPolicy.for_roles(*ledger_tools.APPROVERS), targets=open_items(),
))
