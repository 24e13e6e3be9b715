"""What `enqueue` and `enqueue_many` take besides the calls, and what they answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from executor.core.types import CallStatus
from executor.providers.hosted import HostedCall, HostedPolicy


@dataclass(frozen=True)
class HostedCalls:
    """The provider-run calls of the response whose proposals are being enqueued
    (`surface.read_hosted_calls(response)`), and the hosted-tool policy the request
    declared (the one `export_mcp_tools` / `export_mcp_servers` put into it).

    `approval_ttl_seconds`: how long an `mcp_approval_request` recorded from these
    calls waits for a decision before the reconciler expires it (answered: denied).
    """

    calls: Sequence[HostedCall]
    policy: HostedPolicy
    approval_ttl_seconds: float = 24 * 3600.0


@dataclass(frozen=True)
class CallHandle:
    call_id: str
    tool_name: str
    operation_id: str | None
    status: CallStatus


@dataclass(frozen=True)
class EnqueueHandle:
    request_id: str
    calls: tuple[CallHandle, ...]

    @property
    def operation_ids(self) -> dict[str, str]:
        """call id → operation id: keep these to retry the same logical operations."""
        return {c.call_id: c.operation_id for c in self.calls if c.operation_id}
