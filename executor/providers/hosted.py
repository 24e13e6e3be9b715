"""Calls the provider runs itself (hosted MCP servers, web search, code execution).

toolfence never runs these and cannot stop them once the provider has: what it
can do is read every one of them, so none is silent, and check each against
the application's declaration of which hosted tools may run. Each surface
module reads its own items into `HostedCall`s (`read_hosted_calls`); this
module holds the neutral record, the policy, and the check.

The policy is one frozen value that both sides read: the surfaces export it
into the request (the OpenAI `mcp` tool entries' `allowed_tools` and
`require_approval`, Anthropic's `mcp_servers` `tool_configuration`), and
`hosted_violations` checks the response against the same value. A provider
that ran something the request did not allow (a stale request, a proxy that
rewrote it, a provider bug) is reported, never dropped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from executor.core.canonical import NotCanonicalizable, canonical_json
from executor.core.types import ErrorCode, ErrorDetail, ToolError


@dataclass(frozen=True)
class HostedCall:
    """One provider-run item, read from a response.

    `kind` is the surface's own item type (`mcp_call`, `server_tool_use`,
    `executable_code`, ...). `server_label` is the MCP server's label (None for a
    built-in tool such as web search); `tool_name` the hosted tool (built-in
    tools are named for their tool type: `web_search`, `code_interpreter`,
    `code_execution`). `arguments` is JSON text: as the provider wrote it when
    it sends text, canonical JSON when it sends an object. `item_id` is the
    provider's id of the item (for a result, the id of the call it answers).
    `output_digest` is the SHA-256 of the canonical output, never the output
    itself: third-party text stays out of audit rows and logs.
    `is_result` marks items that only report a run (`mcp_tool_result`, ...);
    the check applies to the items that ask for one.
    `approval_request_id` is the approval an `mcp_call` ran under, if any.
    """

    surface: str
    kind: str
    server_label: str | None
    tool_name: str | None
    arguments: str | None
    item_id: str | None
    status: str | None
    output_digest: str | None
    is_result: bool = False
    approval_request_id: str | None = None


def arguments_text(value: Any) -> str | None:
    """Arguments as JSON text: text is kept as the provider wrote it."""
    if value is None or isinstance(value, str):
        return value
    try:
        return canonical_json(value).decode("utf-8")
    except NotCanonicalizable:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def output_digest(value: Any) -> str | None:
    """SHA-256 (hex) of the canonical JSON of an output; None when there is none."""
    if value is None:
        return None
    try:
        material = canonical_json(value)
    except NotCanonicalizable:
        # Not RFC 8785-able (a huge integer): still a stable digest of the value.
        material = json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr).encode()
    return hashlib.sha256(material).hexdigest()


def text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------- policy


@dataclass(frozen=True)
class HostedServer:
    """One MCP server the provider may call for this application.

    `allowed_tools`: every tool of the server that may run. `approval_required`:
    those of them that may run only after toolfence's approval flow said yes
    (a subset of `allowed_tools`). A tool the server offers and neither names
    never runs. No defaults: an empty set is a decision, not an omission.
    """

    label: str
    url: str
    allowed_tools: frozenset[str]
    approval_required: frozenset[str]

    def __post_init__(self) -> None:
        if not self.label:
            raise ValueError("a hosted MCP server needs a label")
        if not self.approval_required <= self.allowed_tools:
            raise ValueError(
                f"server {self.label!r}: approval_required names tools not in allowed_tools"
            )


@dataclass(frozen=True)
class HostedPolicy:
    """Which provider-run tools may run: MCP servers and built-in tools.

    `builtin_tools` names the provider's own tools by their tool type
    (`web_search`, `file_search`, `code_interpreter`, `code_execution`,
    `web_fetch`, `google_search`, ...), as `HostedCall.tool_name` does.
    """

    servers: tuple[HostedServer, ...]
    builtin_tools: frozenset[str]

    def __post_init__(self) -> None:
        labels = [server.label for server in self.servers]
        if len(labels) != len(set(labels)):
            raise ValueError("two hosted MCP servers share a label")

    def server(self, label: str | None) -> HostedServer | None:
        return next((s for s in self.servers if s.label == label), None)


NO_HOSTED_TOOLS = HostedPolicy(servers=(), builtin_tools=frozenset())
"""Nothing provider-run may happen: every hosted call is a violation."""


# ---------------------------------------------------------------- the check


@dataclass(frozen=True)
class HostedViolation:
    """A hosted call outside the policy, with the stable code to report it under."""

    call: HostedCall
    error: ToolError


_MCP_LISTING_KINDS = frozenset({"mcp_list_tools"})
_APPROVAL_REQUEST_KINDS = frozenset({"mcp_approval_request"})
# MCP calls that may run only under an approval toolfence can see on the item.
_APPROVABLE_CALL_KINDS = frozenset({"mcp_call"})


def _violation(call: HostedCall, message: str, path: str, code: str, expected: str) -> HostedViolation:
    # Details never quote the label or tool name: they are provider/model text.
    return HostedViolation(
        call=call,
        error=ToolError(
            code=ErrorCode.HOSTED_CALL_NOT_ALLOWED,
            message=message,
            details=(ErrorDetail(path=path, code=code, expected=expected),),
        ),
    )


def _check(call: HostedCall, policy: HostedPolicy) -> HostedViolation | None:
    if call.server_label is None:
        if call.tool_name in policy.builtin_tools:
            return None
        return _violation(
            call, "the provider ran a built-in tool the policy does not allow",
            "tool_name", "not_allowed", "a built-in tool the hosted-tool policy names",
        )
    server = policy.server(call.server_label)
    if server is None:
        return _violation(
            call, "the provider used an MCP server the policy does not declare",
            "server_label", "not_allowed", "a server label the hosted-tool policy declares",
        )
    if call.kind in _MCP_LISTING_KINDS:
        return None
    if call.tool_name not in server.allowed_tools:
        return _violation(
            call, "the provider called an MCP tool the policy does not allow",
            "tool_name", "not_allowed", "a tool in the server's allowed_tools",
        )
    needs_approval = call.tool_name in server.approval_required
    if call.kind in _APPROVAL_REQUEST_KINDS:
        if needs_approval:
            return None
        # Asking approval for a tool that needs none is still a request outside the
        # declaration; approving it would widen what the request allowed.
        return _violation(
            call, "the provider asked approval for a tool the policy does not route to approval",
            "tool_name", "approval_not_expected", "a tool in the server's approval_required",
        )
    if needs_approval and not (
        call.kind in _APPROVABLE_CALL_KINDS and call.approval_request_id
    ):
        return _violation(
            call, "the provider ran an MCP tool that needs approval without one",
            "approval_request_id", "approval_missing", "the id of a granted approval request",
        )
    return None


def hosted_violations(
    calls: Iterable[HostedCall], policy: HostedPolicy
) -> list[HostedViolation]:
    """Every hosted call outside `policy`, in response order, code `hosted_call_not_allowed`.

    Results (`is_result`) are not checked: the call they answer is. An
    `mcp_call` for a tool in `approval_required` passes only when it carries an
    `approval_request_id`; whether that approval was granted is for the
    approval flow, which issued it, to confirm.
    """
    found: list[HostedViolation] = []
    for call in calls:
        if call.is_result:
            continue
        violation = _check(call, policy)
        if violation is not None:
            found.append(violation)
    return found


def without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    """The non-None entries of `values`, for arguments assembled from several fields."""
    return {key: value for key, value in values.items() if value is not None}
