"""Counting for a tool in a test process that holds no registry of its own.

A metric's `tool` label takes only the names a `Registry` in the process has
declared (executor/telemetry/metrics.py, decision 0195); a worker process always
holds one. A child that only counts declares its tools first, as a worker would.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from executor.core.tools import Access, Approval, Mode, Registry, Tool


class _NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _never_run(args: _NoArgs, ctx: Any) -> _NoArgs:
    raise AssertionError("only counted, never run")


def declare_tools(*names: str) -> Registry:
    """A registry holding a read tool of each name, so the names are label values."""
    return Registry([
        Tool(
            name=name, description="counted in a test", mode=Mode.READ, input_model=_NoArgs,
            output_model=_NoArgs, run=_never_run, access=Access.public_tool(),
            approval=Approval.never(), untrusted_output=False,
        )
        for name in names
    ])
