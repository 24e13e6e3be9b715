"""The payment tool's arguments and output, shared by the tests of hooks that lose
their connection (test_admission_unavailable.py at admission,
test_execution_recheck.py at the worker's re-check)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    account: str
    amount: int = Field(gt=0)


class Paid(BaseModel):
    receipt: str


__all__ = ["Paid", "PayArgs"]
