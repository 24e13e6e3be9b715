"""The benchmark's own tools (`TOOLFENCE_TOOLS=bench.tools:registry`).

- `bench.noop_write`: an `idempotent` write that does no I/O and returns its
  idempotency key as the receipt: toolfence's own cost per write, apples to apples
  with the plain-SQL floor.
- `bench.sleep_read`: a read that sleeps `BENCH_SLEEP_SECONDS` (default 0.1), as an
  HTTP API answering in 100 ms would: the I/O-bound fleet.
- the ledger's tools, for the realistic fenced write.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, ConfigDict

from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from ledger.tools import registry as ledger_registry


class Numbered(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


class Done(BaseModel):
    receipt: str


def _noop_write(args: Numbered, ctx: RunContext) -> Written:
    return Written(Done(receipt=ctx.idempotency_key), ctx.idempotency_key)


def _sleep_read(args: Numbered, ctx: RunContext) -> Done:
    time.sleep(float(os.environ.get("BENCH_SLEEP_SECONDS", "0.1")))
    return Done(receipt=str(args.n))


noop_write: Tool[Numbered] = Tool(
    name="bench.noop_write", description="An idempotent write that does nothing.",
    mode=Mode.WRITE, untrusted_output=False, input_model=Numbered, output_model=Done,
    run=_noop_write, access=Access.public_tool(), approval=Approval.never(),
    effect=[Effect.IDEMPOTENT],
)

sleep_read: Tool[Numbered] = Tool(
    name="bench.sleep_read", description="A read that waits like a slow API.",
    mode=Mode.READ, untrusted_output=False, input_model=Numbered, output_model=Done,
    run=_sleep_read, access=Access.public_tool(), approval=Approval.never(),
)

registry = Registry([noop_write, sleep_read, *ledger_registry])
