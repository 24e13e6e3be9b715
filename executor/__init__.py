"""toolfence's public API: import from here, not from the modules behind it.

    from executor import ProposedCall, ServerContext, Settings, enqueue, make_engine, results

Every name below is stable across the package layout (`executor/core`, `store`,
`worker`, `providers`, `mcp`, `telemetry`, `cli`), which may move. Names are
loaded on first use (PEP 562), so `import executor.core.states` in a pure
module does not pull in SQLAlchemy, Celery or an SDK through this file.

- Declaring tools: `Tool`, `Mode`, `Effect`, `Access`, `Approval`, `Amount`,
  `ApproverPolicy` (with `ApprovalSubject`, `ApproverRefusal`), `RetryPolicy`,
  `ToolBudget`, `Written`, `Observed`, `LookupAnswer`, `LookupResult`,
  `RunContext`, `Registry` (and its role resolver's `RoleResolutionFailed`),
  `load_registry`, and the failures a tool raises (`RetryableError`,
  `TerminalError`, `BusinessRuleViolation`, `StaleFencingToken`, ...).
- Values: `ProposedCall`, `ServerContext`, the results (`Succeeded`,
  `FailedRetryable`, `FailedTerminal`, `Pending`), `ErrorCode`, `State`.
- Producing: `enqueue`, `enqueue_many` (many requests in one transaction, each a
  `QueuedRequest`), `results`, `wait_for_results`, `final`, `settled`,
  `default_operation_id`, `Budgets`, `BudgetLimits`; `Settings`, `make_engine`,
  `get_engine`, `migrate`; what `enqueue` raises besides a malformed batch
  (`InvalidBatch`, `InvalidIdentifier`): `StoreDatabaseError` (its
  `connection_error` says whether trying again may help) and
  `AdmissionUnavailable` (a tool's hook lost its connection: roll back, try again).
- Provider surfaces: `SURFACES`, `Surface`, `AdapterError`,
  `encode_tool_name`, `decode_tool_name`; provider-run calls: `HostedPolicy`,
  `HostedServer`, `NO_HOSTED_TOOLS`, `HostedCall`, `hosted_violations`, and
  `HostedCalls` (to record them with `enqueue(..., hosted=...)`),
  `hosted_approval_responses` and `NoApprovalResponse` (answering the
  `mcp_approval_request`s toolfence decided), and the policy's
  exports `export_mcp_tools` (OpenAI Responses), `export_mcp_servers` (Anthropic);
  MCP: `register_mcp_server`, `ToolPolicy`.
- Turns: `start_turn`, `get_turn`, `TurnHandle`, `TurnInProgress`, `TurnOptions`,
  `TurnState`; turn surfaces: `TurnSurface`, `Writes`, `Target`, `open_items`;
  drivers: `Driver`, `DriverError`, `ScriptedDriver`, `load_driver`,
  `ModelRequest`, `ModelResponse`, `Usage`.
- Errors: `ToolfenceError`, the base of every error toolfence raises, and its
  kinds `ConfigurationError`, `AdmissionError`, `StoreError`, `ProviderError`,
  `TurnError`, `HttpError`, `WorkerError`, `CommandError` (catch the base, branch
  on the kind). What a tool raises (`ToolFailure` and the rest above) is not one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executor.core.admission import AdmissionUnavailable
    from executor.core.amounts import Amount
    from executor.core.approvers import (
        ApprovalSubject,
        ApproverPolicy,
        ApproverRefusal,
    )
    from executor.core.budgets import (
        BudgetLimits,
        Budgets,
        ToolBudget,
    )
    from executor.core.identifiers import (
        InvalidIdentifier,
        default_operation_id,
    )
    from executor.core.states import (
        State,
        TurnState,
    )
    from executor.core.surfaces import Target, TurnSurface, Writes
    from executor.core.tools import (
        Access,
        Approval,
        BusinessRuleViolation,
        Effect,
        InvalidResult,
        LookupAnswer,
        LookupResult,
        LostOwnership,
        Mode,
        Observed,
        Registry,
        RetryableError,
        RetryPolicy,
        RoleResolutionFailed,
        RunContext,
        StaleFencingToken,
        TerminalError,
        Tool,
        ToolDeclarationError,
        ToolFailure,
        Written,
        load_registry,
    )
    from executor.core.types import (
        CallResult,
        CallStatus,
        ErrorCode,
        ErrorDetail,
        FailedRetryable,
        FailedTerminal,
        Pending,
        ProposedCall,
        ServerContext,
        Succeeded,
        ToolError,
    )
    from executor.errors import (
        AdmissionError,
        CommandError,
        ConfigurationError,
        HttpError,
        ProviderError,
        StoreError,
        ToolfenceError,
        TurnError,
        WorkerError,
    )
    from executor.mcp import (
        ToolPolicy,
        register_mcp_server,
    )
    from executor.providers import (
        SURFACES,
        AdapterError,
        Surface,
        decode_tool_name,
        encode_tool_name,
    )
    from executor.providers.anthropic_messages import (
        export_mcp_servers,
    )
    from executor.providers.hosted import (
        NO_HOSTED_TOOLS,
        HostedCall,
        HostedPolicy,
        HostedServer,
        hosted_violations,
    )
    from executor.providers.openai_responses import (
        export_mcp_tools,
    )
    from executor.sandbox import (
        SandboxResult,
        SandboxUnavailable,
        run_python_tool,
    )
    from executor.settings import (
        Settings,
        SettingsError,
    )
    from executor.store.engine import (
        get_engine,
        make_engine,
    )
    from executor.store.errors import StoreDatabaseError
    from executor.store.migrate import (
        migrate,
    )
    from executor.turns.drivers import (
        Driver,
        DriverError,
        ScriptedDriver,
    )
    from executor.turns.service import (
        TurnHandle,
        TurnInProgress,
        get_turn,
        start_turn,
    )
    from executor.turns.specs import load_driver
    from executor.turns.targets import open_items
    from executor.turns.values import (
        ModelRequest,
        ModelResponse,
        TurnOptions,
        Usage,
    )
    from outbox.batches import QueuedRequest, enqueue_many
    from outbox.handles import CallHandle, EnqueueHandle, HostedCalls
    from outbox.producer import (
        InvalidBatch,
        NoApprovalResponse,
        enqueue,
        hosted_approval_responses,
    )
    from outbox.results import final, results, settled, wait_for_results

# name -> module that defines it
_EXPORTS: dict[str, str] = {
    "ApprovalSubject": "executor.core.approvers",
    "ApproverPolicy": "executor.core.approvers",
    "ApproverRefusal": "executor.core.approvers",
    "BudgetLimits": "executor.core.budgets",
    "Budgets": "executor.core.budgets",
    "ToolBudget": "executor.core.budgets",
    "Access": "executor.core.tools",
    "Amount": "executor.core.amounts",
    "Approval": "executor.core.tools",
    "BusinessRuleViolation": "executor.core.tools",
    "Effect": "executor.core.tools",
    "InvalidResult": "executor.core.tools",
    "LookupAnswer": "executor.core.tools",
    "LookupResult": "executor.core.tools",
    "LostOwnership": "executor.core.tools",
    "Mode": "executor.core.tools",
    "Observed": "executor.core.tools",
    "Registry": "executor.core.tools",
    "RetryPolicy": "executor.core.tools",
    "RetryableError": "executor.core.tools",
    "RoleResolutionFailed": "executor.core.tools",
    "RunContext": "executor.core.tools",
    "StaleFencingToken": "executor.core.tools",
    "TerminalError": "executor.core.tools",
    "Tool": "executor.core.tools",
    "ToolDeclarationError": "executor.core.tools",
    "ToolFailure": "executor.core.tools",
    "Written": "executor.core.tools",
    "load_registry": "executor.core.tools",
    "CallResult": "executor.core.types",
    "CallStatus": "executor.core.types",
    "ErrorCode": "executor.core.types",
    "ErrorDetail": "executor.core.types",
    "FailedRetryable": "executor.core.types",
    "FailedTerminal": "executor.core.types",
    "Pending": "executor.core.types",
    "ProposedCall": "executor.core.types",
    "ServerContext": "executor.core.types",
    "Succeeded": "executor.core.types",
    "ToolError": "executor.core.types",
    "State": "executor.core.states",
    "Settings": "executor.settings",
    "SettingsError": "executor.settings",
    "get_engine": "executor.store.engine",
    "make_engine": "executor.store.engine",
    "migrate": "executor.store.migrate",
    "AdmissionUnavailable": "executor.core.admission",
    "StoreDatabaseError": "executor.store.errors",
    "CallHandle": "outbox.handles",
    "EnqueueHandle": "outbox.handles",
    "HostedCalls": "outbox.handles",
    "QueuedRequest": "outbox.batches",
    "enqueue_many": "outbox.batches",
    "InvalidBatch": "outbox.producer",
    "InvalidIdentifier": "executor.core.identifiers",
    "NoApprovalResponse": "outbox.producer",
    "hosted_approval_responses": "outbox.producer",
    "default_operation_id": "executor.core.identifiers",
    "enqueue": "outbox.producer",
    "final": "outbox.results",
    "results": "outbox.results",
    "settled": "outbox.results",
    "wait_for_results": "outbox.results",
    "SURFACES": "executor.providers",
    "HostedCall": "executor.providers.hosted",
    "HostedPolicy": "executor.providers.hosted",
    "HostedServer": "executor.providers.hosted",
    "NO_HOSTED_TOOLS": "executor.providers.hosted",
    "hosted_violations": "executor.providers.hosted",
    "export_mcp_tools": "executor.providers.openai_responses",
    "export_mcp_servers": "executor.providers.anthropic_messages",
    "AdapterError": "executor.providers",
    "Surface": "executor.providers",
    "decode_tool_name": "executor.providers",
    "encode_tool_name": "executor.providers",
    "AdmissionError": "executor.errors",
    "CommandError": "executor.errors",
    "ConfigurationError": "executor.errors",
    "HttpError": "executor.errors",
    "ProviderError": "executor.errors",
    "StoreError": "executor.errors",
    "ToolfenceError": "executor.errors",
    "TurnError": "executor.errors",
    "WorkerError": "executor.errors",
    "ToolPolicy": "executor.mcp",
    "register_mcp_server": "executor.mcp",
    "TurnState": "executor.core.states",
    "TurnOptions": "executor.turns.values",
    "ModelRequest": "executor.turns.values",
    "ModelResponse": "executor.turns.values",
    "Usage": "executor.turns.values",
    "Driver": "executor.turns.drivers",
    "DriverError": "executor.turns.drivers",
    "ScriptedDriver": "executor.turns.drivers",
    "load_driver": "executor.turns.specs",
    "TurnHandle": "executor.turns.service",
    "TurnInProgress": "executor.turns.service",
    "get_turn": "executor.turns.service",
    "start_turn": "executor.turns.service",
    "Target": "executor.core.surfaces",
    "SandboxResult": "executor.sandbox",
    "SandboxUnavailable": "executor.sandbox",
    "run_python_tool": "executor.sandbox",
    "TurnSurface": "executor.core.surfaces",
    "Writes": "executor.core.surfaces",
    "open_items": "executor.turns.targets",
}

__all__ = [
    "Access",
    "Amount",
    "AdmissionError",
    "AdmissionUnavailable",
    "AdapterError",
    "Approval",
    "ApprovalSubject",
    "ApproverPolicy",
    "ApproverRefusal",
    "BudgetLimits",
    "Budgets",
    "BusinessRuleViolation",
    "CallHandle",
    "CallResult",
    "CallStatus",
    "CommandError",
    "ConfigurationError",
    "Driver",
    "DriverError",
    "Effect",
    "EnqueueHandle",
    "ErrorCode",
    "ErrorDetail",
    "FailedRetryable",
    "FailedTerminal",
    "HostedCall",
    "HostedCalls",
    "HostedPolicy",
    "HostedServer",
    "HttpError",
    "InvalidBatch",
    "InvalidIdentifier",
    "InvalidResult",
    "LookupAnswer",
    "LookupResult",
    "LostOwnership",
    "Mode",
    "ModelRequest",
    "ModelResponse",
    "NO_HOSTED_TOOLS",
    "NoApprovalResponse",
    "Observed",
    "Pending",
    "ProposedCall",
    "QueuedRequest",
    "ProviderError",
    "Registry",
    "RetryPolicy",
    "RetryableError",
    "RoleResolutionFailed",
    "RunContext",
    "SURFACES",
    "ScriptedDriver",
    "ServerContext",
    "Settings",
    "SettingsError",
    "StaleFencingToken",
    "State",
    "StoreDatabaseError",
    "StoreError",
    "Succeeded",
    "Surface",
    "TerminalError",
    "Tool",
    "ToolBudget",
    "ToolDeclarationError",
    "ToolError",
    "ToolFailure",
    "ToolPolicy",
    "ToolfenceError",
    "TurnError",
    "TurnHandle",
    "TurnInProgress",
    "TurnOptions",
    "TurnState",
    "Usage",
    "WorkerError",
    "Written",
    "decode_tool_name",
    "default_operation_id",
    "encode_tool_name",
    "enqueue",
    "enqueue_many",
    "export_mcp_servers",
    "export_mcp_tools",
    "final",
    "get_engine",
    "get_turn",
    "hosted_approval_responses",
    "hosted_violations",
    "load_driver",
    "load_registry",
    "make_engine",
    "migrate",
    "register_mcp_server",
    "results",
    "settled",
    "start_turn",
    "wait_for_results",
    "Target",
    "TurnSurface",
    "Writes",
    "open_items",
    "SandboxResult",
    "SandboxUnavailable",
    "run_python_tool",
]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'executor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
