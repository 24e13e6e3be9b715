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
import importlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from executor.core.admission import Limits
from executor.core.approvers import ApproverPolicy
from executor.core.canonical import NotCanonicalizable, canonical_json
from executor.core.identifiers import MAX_IDENTIFIER_CHARS, identifier_problem
from executor.core.strictjson import StrictJSONError, loads_strict
from executor.core.types import ErrorCode, ErrorDetail, ToolError
from executor.errors import ConfigurationError


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
    `unknown` marks an item of a type the surface does not know
    (`unknown_item`): reported under every policy, never skipped.
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
    unknown: bool = False

    @property
    def requests_approval(self) -> bool:
        """An approval request the provider waits on (`mcp_approval_request`), not a
        result reporting one."""
        return self.kind in _APPROVAL_REQUEST_KINDS and not self.is_result


UNKNOWN_KIND_CHARS = 64
"""How much of an unknown item's provider-written type is kept as its `kind`: the
width of `toolfence_hosted_calls.kind`, so what is reported is what is stored."""


def unknown_item(surface: str, kind: object, item_id: object = None) -> HostedCall:
    """An output item, block, part or step of a type the surface does not know.

    Deny by default: the provider may have run something through it, so it is
    reported as a hosted call that no policy allows (`hosted_violations` gives
    it detail `unknown_item`), never skipped. `kind` keeps a bounded prefix of
    the provider's type when it is printable text (a NUL or a lone surrogate
    could not be stored or shown), else a digest of it; no tool name is
    guessed from it.
    """
    if not isinstance(kind, str) or not kind:
        text = "<no type>"
    elif kind[:UNKNOWN_KIND_CHARS].isprintable():  # a lone surrogate (Cs) is not printable either
        text = kind[:UNKNOWN_KIND_CHARS]
    else:
        digest = hashlib.sha256(kind.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        text = f"<unprintable {digest}>"
    return HostedCall(
        surface=surface, kind=text, server_label=None, tool_name=None, arguments=None,
        item_id=text_or_none(item_id), status=None, output_digest=None, unknown=True,
    )


def arguments_text(value: Any) -> str | None:
    """Arguments as JSON text: text is kept as the provider wrote it."""
    if value is None or isinstance(value, str):
        return value
    try:
        return canonical_json(value).decode("utf-8")
    except (NotCanonicalizable, UnicodeDecodeError):
        return _loose_json(value)


def output_digest(value: Any) -> str | None:
    """SHA-256 (hex) of the canonical JSON of an output; None when there is none."""
    if value is None:
        return None
    try:
        material = canonical_json(value)
    except NotCanonicalizable:
        # Not RFC 8785-able (a huge integer, a lone surrogate): still a stable digest.
        material = _loose_json(value).encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()


UNSERIALISABLE = '"[unserialisable]"'
"""What a provider value nested too deeply to serialise is recorded as: a hosted
approval bound to it matches no real arguments, so it fails closed."""


def _loose_json(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    except (RecursionError, ValueError, TypeError):
        return UNSERIALISABLE


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
    `approvers`: who may decide this server's approval requests, checked by the
    same `approver_refusal` as a tool's; required as soon as `approval_required`
    names a tool (as `Tool` requires it when its approval can be needed).
    """

    label: str
    url: str
    allowed_tools: frozenset[str]
    approval_required: frozenset[str]
    approvers: ApproverPolicy | None = None

    def __post_init__(self) -> None:
        if not self.label:
            raise ValueError("a hosted MCP server needs a label")
        if not self.approval_required <= self.allowed_tools:
            raise ValueError(
                f"server {self.label!r}: approval_required names tools not in allowed_tools"
            )
        if self.approvers is None:
            if self.approval_required:
                raise ValueError(
                    f"server {self.label!r} routes tools to approval and must declare approvers "
                    "explicitly (an ApproverPolicy)"
                )
        elif not isinstance(self.approvers, ApproverPolicy):
            raise ValueError(f"server {self.label!r}: approvers must be an ApproverPolicy")
        elif not self.approvers.roles and self.approvers.rule is None:
            raise ValueError(f"server {self.label!r}: approvers names no role and no rule")


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

    def approvers_for(self, server_label: str, tool_name: str) -> ApproverPolicy | None:
        """Who decides an approval of `tool_name` on `server_label` under this policy now:
        None when the server is gone or no longer routes the tool to approval (the
        approver is then refused `no_approver_policy`, as for a removed tool)."""
        server = self.server(server_label)
        if server is None or tool_name not in server.approval_required:
            return None
        return server.approvers


NO_HOSTED_TOOLS = HostedPolicy(servers=(), builtin_tools=frozenset())
"""Nothing provider-run may happen: every hosted call is a violation."""


def load_hosted_policy(spec: str | None) -> HostedPolicy:
    """The HostedPolicy a `module:attribute` spec names (TOOLFENCE_HOSTED_POLICY, read
    by `enqueue`, `serve`, `approve`/`deny` and the worker's turns); NO_HOSTED_TOOLS
    when unset. A policy that cannot be loaded is a `ConfigurationError`, never an
    empty policy (nor a permissive one)."""
    if spec is None:
        return NO_HOSTED_TOOLS
    refused = f"cannot load the hosted-tool policy TOOLFENCE_HOSTED_POLICY={spec!r}"
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{refused}: expected module:attribute")
    try:
        policy = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:
        why = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigurationError(f"{refused}: {type(exc).__name__}" + (f": {why}" if why else "")) from exc
    if not isinstance(policy, HostedPolicy):
        raise ConfigurationError(f"{refused}: {type(policy).__name__}, not a HostedPolicy")
    return policy


# ---------------------------------------------------------------- approvals


def hosted_arguments(arguments: str | None, limits: Limits | None = None) -> Any:
    """A hosted call's arguments, parsed as a proposal's are: by the strict parser
    (executor/core/strictjson.py) under the same `Limits` (TOOLFENCE_MAX_ARGUMENT_BYTES,
    TOOLFENCE_MAX_ARGUMENT_DEPTH); None for none, `{}` for blank text. Raises
    `StrictJSONError` (`too_large`, `too_deep`, `duplicate_key`, `non_finite`,
    `not_utf8`, `json_syntax`) and nothing else: no RecursionError however deep."""
    if arguments is None:
        return None
    if arguments.strip() == "":
        # As for a proposal: several providers send "" for a call without arguments.
        return {}
    limits = limits or Limits()
    return loads_strict(
        arguments, max_bytes=limits.max_argument_bytes, max_depth=limits.max_argument_depth
    )


def hosted_intent_hash(
    tenant: str,
    server_label: str,
    tool_name: str,
    arguments: str | None,
    limits: Limits | None = None,
) -> str:
    """What a hosted approval is bound to: SHA-256 of the canonical JSON of (tenant,
    server label, tool, canonical arguments). Arguments are the provider's JSON
    text, parsed by `hosted_arguments` and canonicalised so the same object spelt
    differently hashes alike; text the strict parser refuses (or that has no
    canonical form) is bound by its SHA-256, so it matches no approval toolfence
    recorded (an approval request with such arguments is refused). Never raises."""
    parsed: Any
    try:
        parsed = hosted_arguments(arguments, limits)
        canonical_json(parsed)
    except (StrictJSONError, NotCanonicalizable):
        material = (arguments or "").encode("utf-8", "surrogatepass")
        parsed = {"unparsed_sha256": hashlib.sha256(material).hexdigest()}
    document = {
        "tenant": tenant,
        "server_label": server_label,
        "tool": tool_name,
        "arguments": parsed,
    }
    try:
        encoded = canonical_json(document)
    except NotCanonicalizable:
        # A label or tool name with a lone surrogate (identifiers are checked before an
        # approval is recorded, so this binds nothing real): still a stable digest.
        encoded = json.dumps(document, sort_keys=True, ensure_ascii=True).encode("ascii")
    return hashlib.sha256(encoded).hexdigest()


@dataclass(frozen=True)
class GrantedApprovals:
    """The approvals toolfence's flow granted, for checking `mcp_call`s that cite one.

    `intents`: provider approval_request_id → the intent hash it was granted for
    (`hosted_intent_hash`), only for approvals in state `approved`.
    """

    tenant: str
    intents: Mapping[str, str]


# ---------------------------------------------------------------- the check


@dataclass(frozen=True)
class HostedViolation:
    """A hosted call outside the policy, with the stable code to report it under."""

    call: HostedCall
    error: ToolError


_MCP_LISTING_KINDS = frozenset({"mcp_list_tools", "mcp_tool_listing"})
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


_NAME_EXPECTED = f"printable UTF-8 text of 1..{MAX_IDENTIFIER_CHARS} characters"


def _approval_request_refusal(call: HostedCall, limits: Limits | None) -> HostedViolation | None:
    """An approval request toolfence can neither record nor answer as the provider
    wrote it: its id (answered back verbatim, so never clipped), server label or tool
    name is not an identifier (executor/core/identifiers.py), or its arguments fail
    the proposals' strict parse and limits. Refused, so nothing can approve it."""
    names = (("item_id", call.item_id), ("server_label", call.server_label), ("tool_name", call.tool_name))
    for path, value in names:
        problem = identifier_problem(value)
        if problem is not None:
            return _violation(
                call, "the provider asked approval under an id, server label or tool name "
                "toolfence cannot record", path, problem.value, _NAME_EXPECTED,
            )
    limits = limits or Limits()
    expected = (
        f"JSON of at most {limits.max_argument_bytes} bytes and {limits.max_argument_depth} levels"
    )
    try:
        canonical_json(hosted_arguments(call.arguments, limits))
    except StrictJSONError as refused:
        return _violation(
            call, "the provider asked approval for arguments that are not valid JSON within the limits",
            "arguments", refused.code, expected,
        )
    except NotCanonicalizable:
        return _violation(
            call, "the provider asked approval for arguments that have no canonical form",
            "arguments", "not_canonicalizable", expected,
        )
    return None


def _check(
    call: HostedCall, policy: HostedPolicy, granted: GrantedApprovals | None, limits: Limits | None
) -> HostedViolation | None:
    if call.unknown:
        return _violation(
            call, "the provider returned an item toolfence does not know, which may have run a tool",
            "kind", "unknown_item", "an item type the surface's adapter reads",
        )
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
    if needs_approval and granted is not None and call.approval_request_id:
        return _check_granted(call, call.server_label, call.approval_request_id, granted, limits)
    return None


def _check_granted(
    call: HostedCall, server_label: str, approval_request_id: str, granted: GrantedApprovals,
    limits: Limits | None,
) -> HostedViolation | None:
    granted_intent = granted.intents.get(approval_request_id)
    if granted_intent is None:
        # Never asked of toolfence, still pending, denied or expired: the provider (or
        # whoever answered it) approved it, not toolfence.
        return _violation(
            call, "the provider ran an MCP tool under an approval toolfence did not grant",
            "approval_request_id", "approval_not_granted", "the id of an approval toolfence granted",
        )
    intent = hosted_intent_hash(
        granted.tenant, server_label, call.tool_name or "", call.arguments, limits
    )
    if intent != granted_intent:
        return _violation(
            call, "the provider ran an MCP call other than the one toolfence approved",
            "approval_request_id", "approval_intent_mismatch",
            "the server, tool and arguments the approval was granted for",
        )
    return None


def hosted_violations(
    calls: Iterable[HostedCall],
    policy: HostedPolicy,
    granted: GrantedApprovals | None = None,
    limits: Limits | None = None,
) -> list[HostedViolation]:
    """Every hosted call outside `policy`, in response order, code `hosted_call_not_allowed`.

    Results (`is_result`) are not checked: the call they answer is. An
    `mcp_call` for a tool in `approval_required` passes only when it carries an
    `approval_request_id`, and, given `granted` (what the approval store holds;
    `enqueue(hosted=...)` always passes it), only when toolfence granted that
    approval for the same server, tool and canonical arguments
    (`approval_not_granted`, `approval_intent_mismatch`). Without `granted` the
    check is the id's presence only: a pure reader cannot see the store.

    An `mcp_approval_request` the policy routes to approval is refused when its id,
    server label or tool name is not an identifier (detail `path` the field, `code`
    the `IdentifierProblem`) or its arguments fail the proposals' strict parse under
    `limits` (default `Limits()`; detail `path` `arguments`, `code` the
    `StrictJSONError` code): toolfence could not record or answer it as written.
    """
    found: list[HostedViolation] = []
    for call in calls:
        if call.is_result:
            continue
        violation = _check(call, policy, granted, limits)
        if violation is None and call.kind in _APPROVAL_REQUEST_KINDS:
            # Within the policy: still refused when toolfence cannot record or answer it.
            violation = _approval_request_refusal(call, limits)
        if violation is not None:
            found.append(violation)
    return found


def without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    """The non-None entries of `values`, for arguments assembled from several fields."""
    return {key: value for key, value in values.items() if value is not None}
