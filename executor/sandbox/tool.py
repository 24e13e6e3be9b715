"""`sandbox.run_python`: model-written Python, run in the sandbox, as a declared tool.

Opt-in: nothing registers it; an application adds `run_python_tool(access=...)` to
its registry, choosing who may call it and whether a person approves each call.

Effect contract: the program has no effect outside its run. It sees no network,
no host file and no host process; its work directory is a tmpfs that ends with
it. So the tool is declared a read: a retry, or a takeover after a lost lease,
runs the program again, and that is harmless (docs/design.md §Effect contracts).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from executor.core.approvers import ApproverPolicy
from executor.core.tools import Access, Approval, Mode, RunContext, Tool, ToolFailure
from executor.core.types import ErrorCode
from executor.sandbox.command import Runtime, SandboxUnavailable
from executor.sandbox.limits import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_SECONDS,
    FILE_NAME_RE,
    MAX_CODE_BYTES,
    MAX_INPUT_FILES,
    MIN_MEMORY_MB,
    InvalidProgram,
    Limits,
    Program,
)
from executor.sandbox.result import LIMIT_OUTCOMES, Outcome, SandboxResult, limit_message, shape
from executor.sandbox.runner import execute
from executor.settings import read

log = logging.getLogger(__name__)

NAME = "sandbox.run_python"
DESCRIPTION = (
    "Run a short Python 3 program (standard library only) in a sandbox: no network, no host "
    "files, a private work directory, limited time and memory. Returns its outcome, exit "
    "status, stdout, stderr and the files it wrote in its work directory. Input files are "
    "written beside the program. Print what you need. Running it has no effect outside the run."
)
LIMIT_CODES = {
    Outcome.TIMEOUT: ErrorCode.SANDBOX_TIMEOUT,
    Outcome.MEMORY_LIMIT: ErrorCode.SANDBOX_MEMORY_LIMIT,
    Outcome.OUTPUT_LIMIT: ErrorCode.SANDBOX_OUTPUT_LIMIT,
}
# The call's deadline, less what the run may need past its own timeout.
DEADLINE_MARGIN_SECONDS = 1.0


class InputFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=FILE_NAME_RE.pattern, description="a file name in the work directory")
    content: str = Field(max_length=256 * 1024, description="the file's UTF-8 text")


class RunPythonArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str = Field(min_length=1, max_length=MAX_CODE_BYTES, description="the program (main.py)")
    files: Annotated[list[InputFile], Field(max_length=MAX_INPUT_FILES)] = Field(
        default_factory=list, description="input files written beside the program"
    )
    timeout_seconds: float | None = Field(
        default=None, gt=0, le=3600, description="wall-clock seconds (held to the operator's maximum)"
    )
    memory_mb: int | None = Field(
        default=None, ge=MIN_MEMORY_MB, le=1024 * 1024,
        description="address space in MiB (held to the operator's maximum)",
    )


def call_limits(args: RunPythonArgs, deadline: float | None = None) -> Limits:
    """What a call asked for, held to the operator's maxima and to the call's deadline."""
    limits = Limits(
        timeout_seconds=args.timeout_seconds or DEFAULT_TIMEOUT_SECONDS,
        memory_mb=args.memory_mb or DEFAULT_MEMORY_MB,
    ).within(
        float(read("TOOLFENCE_SANDBOX_MAX_TIMEOUT_SECONDS")), int(read("TOOLFENCE_SANDBOX_MAX_MEMORY_MB"))
    )
    if deadline is not None:
        left = deadline - time.time() - limits.grace_seconds - DEADLINE_MARGIN_SECONDS
        limits = replace(limits, timeout_seconds=round(max(0.1, min(limits.timeout_seconds, left)), 3))
    return limits


def run_sandboxed(args: RunPythonArgs, deadline: float | None = None) -> SandboxResult:
    """Run a call's program; the result for any outcome, or SandboxUnavailable."""
    try:
        program = Program(args.code, tuple((f.name, f.content) for f in args.files))
    except InvalidProgram as exc:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, str(exc), retryable=False) from None
    limits = call_limits(args, deadline)
    return shape(execute(program, limits, Runtime.from_settings()), limits)


def _run(args: RunPythonArgs, ctx: RunContext) -> SandboxResult:
    try:
        result = run_sandboxed(args, ctx.deadline)
    except SandboxUnavailable as exc:
        # The operator's reason goes to the log; the model is told only that it cannot run here.
        log.warning("sandbox unavailable: %s", exc)
        raise ToolFailure(
            ErrorCode.SANDBOX_UNAVAILABLE,
            "the sandbox cannot be built on this worker; the program was not run",
            retryable=False,
        ) from None
    if result.outcome in LIMIT_OUTCOMES:
        raise ToolFailure(LIMIT_CODES[result.outcome], limit_message(result), retryable=False)
    return result


def run_python_tool(
    *,
    access: Access,
    approval: Approval | None = None,
    approvers: ApproverPolicy | None = None,
    name: str = NAME,
    timeout_seconds: float = 60.0,
) -> Tool[RunPythonArgs]:
    """The tool, declared: `access` is the deployment's (no default); `approval`
    defaults to never (a program that cannot act outside its run), and a deployment
    that wants a person to read each program first says `Approval.always()` with its
    `approvers`. `timeout_seconds` is the call's deadline: keep it above the
    operator's maximum program timeout plus a few seconds."""
    return Tool(
        name=name,
        description=DESCRIPTION,
        mode=Mode.READ,
        untrusted_output=True,
        input_model=RunPythonArgs,
        output_model=SandboxResult,
        run=_run,
        access=access,
        approval=approval or Approval.never(),
        approvers=approvers,
        timeout_seconds=timeout_seconds,
    )
