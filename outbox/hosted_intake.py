"""A response's hosted calls (the ones a provider ran itself), recorded by `enqueue`
with the request's proposals: each once per request, and each one the request's
hosted-tool policy does not allow reported as a `failed_terminal` call of the
request (moved out of outbox/producer.py as is)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from executor import store
from executor.core.admission import Gate, Limits
from executor.core.identifiers import storable_key
from executor.core.sanitize import sanitize_error_text, sanitize_json
from executor.core.types import ErrorCode, FailedTerminal, ServerContext
from executor.providers.hosted import (
    GrantedApprovals,
    HostedCall,
    hosted_arguments,
    hosted_intent_hash,
    hosted_violations,
)
from executor.telemetry import metrics
from outbox.handles import CallHandle, HostedCalls
from outbox.results import parse_status

HOSTED_TOOL_PREFIX = "hosted."
"""A reported hosted call's tool name is this and its item kind (`hosted.mcp_call`):
bounded, and never the provider's own label or tool name (those stay in the table)."""
_MAX_KEY_CHARS = 160


def _hosted_keys(calls: Sequence[HostedCall]) -> list[str]:
    """Each hosted call's key in its request, the same every time one response is read:
    the provider's item id (a result item's with `/result`: it names the call it
    answers), `<surface>:<kind>:<index>` without one, a digest of an overlong or
    unstorable one, and `#n` on the nth repeat of a key within the response. Every
    key is an identifier of at most 200 characters, so is every call id made of one."""
    keys: list[str] = []
    seen: set[str] = set()
    for index, call in enumerate(calls):
        # Overlong, or text a database cannot hold (NUL, a lone surrogate, control
        # characters): a digest stands for it, so the producer's transaction holds.
        key = storable_key(call.item_id or f"{call.surface}:{call.kind}:{index}", _MAX_KEY_CHARS)
        if call.is_result:
            key += "/result"
        candidate, n = key, 1
        while candidate in seen:
            n += 1
            candidate = f"{key}#{n}"
        seen.add(candidate)
        keys.append(candidate)
    return keys


def _free_call_id(key: str, taken: set[str]) -> str:
    """The item's key as call id, unless a call of the request already has it (a
    proposal the model named alike): then `hosted:<key>`, never overwriting it."""
    if key not in taken:
        return key
    candidate, n = f"hosted:{key}", 1
    while candidate in taken:
        n += 1
        candidate = f"hosted:{key}#{n}"
    return candidate


def record_hosted(
    conn: Connection, context: ServerContext, hosted: HostedCalls, next_position: int, limits: Limits
) -> list[CallHandle]:
    """Record each hosted call (once per request); report each one outside the policy
    as a `failed_terminal` call row of the request. Returns those rows' handles."""
    recorded = store.hosted_calls_of_request(conn, context.tenant, context.request_id)
    call_rows = store.calls_of_request(conn, context.tenant, context.request_id)
    taken = set(call_rows)
    # An mcp_call citing an approval passes only if toolfence granted it, for its intent.
    granted = GrantedApprovals(
        context.tenant,
        store.granted_hosted_intents(
            conn, context.tenant,
            (c.approval_request_id for c in hosted.calls if c.approval_request_id and not c.is_result),
        ),
    )
    handles: list[CallHandle] = []
    for key, call in zip(_hosted_keys(hosted.calls), hosted.calls, strict=True):
        known = recorded.get(key)
        if known is not None:
            # The same response recorded again: its answer stands, nothing is written.
            if known.call_id is not None and known.call_id in call_rows:
                row = call_rows[known.call_id]
                handles.append(
                    CallHandle(row.call_id, row.tool_name, None, parse_status(json.loads(row.result)))
                )
            continue
        violations = [] if call.is_result else hosted_violations([call], hosted.policy, granted, limits)
        if call.requests_approval and not violations:
            _request_hosted_approval(conn, context, call, hosted.approval_ttl_seconds, limits)
        call_id: str | None = None
        if violations:
            [violation] = violations
            call_id = _free_call_id(key, taken)
            taken.add(call_id)
            tool_name = HOSTED_TOOL_PREFIX + storable_key(call.kind, 64)
            result = FailedTerminal(call_id=call_id, tool_name=tool_name, error=violation.error)
            store.record_call(
                conn, tenant=context.tenant, request_id=context.request_id,
                conversation_id=context.conversation_id, call_id=call_id, position=next_position,
                tool_name=tool_name, operation_id=None, gate=Gate.HOSTED,
                result=result.model_dump(mode="json"),
                # Never equal to a proposal's fingerprint: a later proposal reusing
                # this call id is an idempotency_conflict, not this answer.
                proposal_hash=hashlib.sha256(f"hosted\0{key}".encode()).hexdigest(),
            )
            next_position += 1
            handles.append(CallHandle(call_id, tool_name, None, result))
        store.record_hosted_call(
            conn, tenant=context.tenant, request_id=context.request_id, hosted_call_id=key,
            surface=call.surface, kind=call.kind, server_label=call.server_label,
            tool_name=call.tool_name, item_id=call.item_id, status=call.status,
            output_digest=call.output_digest, allowed=None if call.is_result else not violations,
            code=ErrorCode.HOSTED_CALL_NOT_ALLOWED.value if violations else None, call_id=call_id,
        )
        if not call.is_result:
            outcome = "not_allowed" if violations else "allowed"
            metrics.HOSTED_CALLS.labels(call.surface, call.kind, outcome).inc()
    return handles


_IMPACT_MAX_CHARS = 2_000


def _hosted_impact(call: HostedCall, limits: Limits) -> dict[str, Any]:
    """What an approver of a hosted call is shown: server, tool, and the arguments
    (parsed as a proposal's, `hosted_arguments`) redacted (secrets, controls) and
    capped. The provider's text is never stored."""
    arguments: Any = None
    if call.arguments is not None:
        try:
            arguments = sanitize_json(hosted_arguments(call.arguments, limits), _IMPACT_MAX_CHARS)
        except ValueError:
            arguments = {"unparsed": sanitize_error_text(call.arguments, _IMPACT_MAX_CHARS)}
    return {
        "server_label": sanitize_error_text(call.server_label or "", 200),
        "tool": sanitize_error_text(call.tool_name or "", 200),
        "arguments": arguments,
    }


def _request_hosted_approval(
    conn: Connection, context: ServerContext, call: HostedCall, ttl_seconds: float, limits: Limits
) -> None:
    """A pending hosted approval for an `mcp_approval_request` within the policy (whose
    id, server, tool and arguments `hosted_violations` checked: one it refused never
    gets here)."""
    if not call.item_id or not call.server_label or not call.tool_name:
        return
    store.record_hosted_approval(
        conn, tenant=context.tenant, request_id=context.request_id,
        approval_request_id=call.item_id, surface=call.surface, server_label=call.server_label,
        tool_name=call.tool_name,
        intent_hash=hosted_intent_hash(
            context.tenant, call.server_label, call.tool_name, call.arguments, limits
        ),
        impact=_hosted_impact(call, limits), requester=context, ttl_seconds=ttl_seconds,
    )


