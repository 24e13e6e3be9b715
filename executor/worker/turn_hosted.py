"""A turn step's provider-run calls, through the same hosted policy as `enqueue`.

A native step's response may hold calls the provider ran itself (an OpenAI
`mcp_call`, an Anthropic `server_tool_use`, a Gemini `executableCode`). They are
recorded exactly as a producer's `enqueue(..., hosted=HostedCalls(...))`
records them (it is that call, with no proposals, under the step's request id):
`toolfence_hosted_calls`, one `failed_terminal` `hosted_call_not_allowed` call
row per call the policy refuses, a pending hosted approval per
`mcp_approval_request` it routes to approval. They are recorded in the
transaction that checkpoints the step, so a step is never recorded without
them nor they without it.

What the turn does with them is the step's error (`source: hosted`), read by the
pure loop: a refused call ends the turn `hosted_call_not_allowed`, an approval
request `hosted_approval_required` (a turn sends nothing back to the provider, so
it cannot answer one; the approval stays recorded, for the audit and a person).

The policy is the application's, `TOOLFENCE_HOSTED_POLICY` (`module:attribute`),
the one `toolfence serve` and `toolfence enqueue` check; unset, no hosted call may
run (`NO_HOSTED_TOOLS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from executor import store
from executor.core.states import ApprovalState
from executor.core.tools import Registry
from executor.core.types import ErrorCode, FailedTerminal, ServerContext
from executor.providers.hosted import HostedCall, HostedPolicy
from executor.turns.loop import HOSTED
from executor.turns.values import EndReason
from outbox.producer import HostedCalls, enqueue

MAX_LISTED = 20


def record_hosted(
    conn: Connection,
    registry: Registry,
    context: ServerContext,
    calls: Sequence[HostedCall],
    policy: HostedPolicy,
) -> dict[str, Any] | None:
    """Record the step's hosted calls under `context.request_id` (the step's); the
    step's error when one of them stops the turn, else None."""
    if not calls:
        return None
    handle = enqueue(conn, [], context, registry, hosted=HostedCalls(calls, policy))
    refused = [
        c.call_id for c in handle.calls
        if isinstance(c.status, FailedTerminal) and c.status.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED
    ]
    if refused:
        return {
            "code": EndReason.HOSTED_CALL_NOT_ALLOWED.value, "source": HOSTED,
            "message": "the provider ran a hosted call the hosted-tool policy does not allow",
            "calls": refused[:MAX_LISTED],
        }
    if any(c.requests_approval for c in calls):
        # The provider waits for an answer the turn cannot send. (A request whose id,
        # server or tool is no valid identifier was refused above by the policy check,
        # decision 0191: it could be neither recorded nor answered.)
        pending = [
            a.approval_id for a in store.hosted_approvals_of_request(conn, context.tenant, context.request_id)
            if a.state is ApprovalState.PENDING
        ]
        return {
            "code": EndReason.HOSTED_APPROVAL_REQUIRED.value, "source": HOSTED,
            "message": "the provider paused a hosted call for an approval, which a turn cannot answer",
            "approvals": pending[:MAX_LISTED],
        }
    return None
