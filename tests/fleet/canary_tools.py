"""The registry of the canary test's fleet (`TOOLFENCE_TOOLS=canary_tools:registry`):
the fleet's tools plus two that put a secret wherever a tool can: its exception
messages, its error results, a downstream's error text, its output, and the
arguments an approver would be shown.

`CANARY` is shaped like a real credential (`sk-…`): the sanitiser redacts what
looks like one, so a canary that reaches a log, a result, a metric or an
operator's screen is a leak the sanitiser was not given a chance to stop.
"""

from __future__ import annotations

from typing import Literal

import fleet_tools
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text

from executor.core.approvers import ApproverPolicy
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
from ledger.service import default_ledger

CANARY = "sk-canaryCANARYcanaryCANARY0123456789"


class LeakyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["raise", "terminal", "retryable", "downstream", "echo"]
    secret: str = Field(max_length=200)


class LeakyOut(BaseModel):
    text: str


def _leaky(args: LeakyArgs, ctx: RunContext) -> LeakyOut:
    if args.mode == "raise":
        raise RuntimeError(f"unexpected failure while handling {args.secret}")
    if args.mode == "terminal":
        raise TerminalError(f"the downstream refused key {args.secret}")
    if args.mode == "retryable":
        raise RetryableError(f"try again; the token was {args.secret}")
    if args.mode == "downstream":
        # A downstream database quoting the bad value in its own error text.
        with default_ledger().engine.connect() as conn:
            conn.execute(text("SELECT CAST(:value AS integer)"), {"value": args.secret})
    return LeakyOut(text=f"api_key={args.secret} and {args.secret}")


class ApprovalArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    secret: str = Field(max_length=200)
    amount_cents: int = Field(ge=0)


class Receipt(BaseModel):
    receipt: str


def _approved_write(args: ApprovalArgs, ctx: RunContext) -> Written:
    return Written(Receipt(receipt=f"r-{ctx.operation_id}"), f"r-{ctx.operation_id}")


leaky: Tool[LeakyArgs] = Tool(
    name="test.leaky", description="Fails, or answers, with the secret it was given.",
    mode=Mode.READ, untrusted_output=True, input_model=LeakyArgs, output_model=LeakyOut, run=_leaky,
    access=Access.public_tool(), approval=Approval.never(),
    retry=RetryPolicy(max_attempts=2, initial_backoff_seconds=0.2, max_backoff_seconds=0.5),
)

needs_approval: Tool[ApprovalArgs] = Tool(
    name="test.needs_approval", description="A write a person must approve; no impact hook.",
    mode=Mode.WRITE, untrusted_output=False, input_model=ApprovalArgs, output_model=Receipt,
    run=_approved_write, access=Access.public_tool(), approval=Approval.always(),
    approvers=ApproverPolicy.for_roles("approver"), effect=[Effect.IDEMPOTENT],
)

registry = Registry([*fleet_tools.registry, leaky, needs_approval])
