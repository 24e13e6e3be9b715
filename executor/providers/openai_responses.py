"""OpenAI Responses: `function_call` output items in, `function_call_output` items out.

Envelope (what `Response.model_dump(mode="json")` and the HTTP API give):
`output[i] = {"type": "function_call", "id": "fc_…", "call_id": "call_…",
"name", "arguments": "<JSON text>", "status"}`. The correlation key is
`call_id`; `id` is the item's own id and is never used for matching.

Whole envelope refused (`AdapterError`) when calls cannot be correlated or
answered: `output` missing, a `function_call` item that is not the shape above
(`malformed_call_list`), an empty or repeated `call_id`, and items the client
would have to answer but toolfence never declared (`unsupported_call_type`:
custom tools, computer use, shells, apply-patch, client-side tool search,
namespaced functions). Server-run items are not proposals: `read_hosted_calls`
reads them (`mcp_call`, `mcp_list_tools`, `mcp_approval_request`,
`web_search_call`, `file_search_call`, `code_interpreter_call`,
`image_generation_call`, server `tool_search_call`, `program` and their results)
for the hosted-tool check, and reports an item of any type outside
`KNOWN_ITEMS` as an unknown one; an `mcp_approval_request` is answered with
`write_approval_response` once toolfence's approval flow has decided.
Refused before admission, whatever the output holds, a response that did not
finish (`ENDINGS`): `status: "incomplete"` is `truncated_response` (or
`filtered_response` for reason `content_filter`), `failed`, `cancelled`,
`queued`, `in_progress` or an unknown status `unfinished_response`. Also
`truncated_response`: a `function_call` item whose own status is `incomplete`
or `in_progress` (named by its `call_id`): its arguments text is not the
model's whole call even when it parses. Left to the admission gates, per
call: the arguments text, verbatim (`invalid_arguments_json`), and tool names
(`unknown_tool`). This surface has no
"tool calls" stop signal, so there is no `tool_calls_without_calls` case.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from executor.core.tools import Registry
from executor.core.types import ProposedCall, ServerContext
from executor.providers.common import (
    AdapterError,
    AdapterErrorCode,
    CallOutcome,
    NameRule,
    boundary,
    check_call_id,
    check_tool_name,
    check_unique_ids,
    declared_tools,
    decode_tool_name,
    exports_writes,
    one_of,
    order_results,
    parameters_schema,
    quote,
    result_text,
    strict_parameters_schema,
    truncated,
)
from executor.providers.endings import Endings, refuse_unless_finished
from executor.providers.hosted import (
    HostedCall,
    HostedPolicy,
    arguments_text,
    output_digest,
    text_or_none,
    unknown_item,
    without_none,
)

SURFACE = "openai-responses"
# Same function-name rule as Chat Completions (64 characters, [A-Za-z0-9_-]).
NAME_RULE = NameRule(pattern=r"[A-Za-z0-9_-]+", max_length=64)

# Output items the client must answer and toolfence cannot: it never declares
# these tools, so their presence means the request was not made through it.
_CLIENT_ANSWERED_ITEMS = frozenset(
    {
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
    }
)


def _refuse(code: AdapterErrorCode, message: str, call_id: str | None = None) -> AdapterError:
    return AdapterError(code, message, surface=SURFACE, call_id=call_id)


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_proposals(
    response: Mapping[str, Any], *, known_names: Iterable[str] = ()
) -> list[ProposedCall]:
    """The `function_call` items of `output`, in output order.

    `known_names` (the registry's names) is needed only to decode tool names
    that were too long for the provider and were declared in hashed form.
    """
    known_names = tuple(known_names)  # a generator would run dry after one decode
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    output = response.get("output")
    if not isinstance(output, list):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response has no output list")
    # The end first, whatever the items hold: a cut response's last call may be
    # malformed because it was cut, and is refused as cut (0196).
    _refuse_unless_finished(response, output)
    proposals: list[ProposedCall] = []
    for index, item in enumerate(output):
        where = f"output[{index}]"
        if not isinstance(item, Mapping):
            raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, f"{where} is not an object")
        kind = item.get("type")
        if one_of(kind, _CLIENT_ANSWERED_ITEMS) or (
            kind == "tool_search_call" and item.get("execution") == "client"
        ):
            raise _refuse(
                AdapterErrorCode.UNSUPPORTED_CALL_TYPE,
                f"{where} is a {kind} item, which toolfence does not declare or answer",
            )
        if kind == "function_call":
            proposals.append(_read_call(item, where, known_names=known_names))
    check_unique_ids(proposals, surface=SURFACE)
    return proposals


# `status` of the response. `incomplete` with reason `content_filter` is filtered;
# any other incomplete reason (`max_output_tokens`, `max_messages`, `steered`) cut it.
ENDINGS = Endings(
    field="status",
    finished=frozenset({"completed"}),
    truncated=frozenset({"incomplete"}),
    filtered=frozenset(),
    unfinished=frozenset({"failed", "in_progress", "cancelled", "queued"}),
)
_FILTERED_INCOMPLETE_REASONS = frozenset({"content_filter"})

# A function_call item the model has not finished writing: `incomplete` when the
# response was cut off, `in_progress` in a snapshot taken while it streams.
_UNFINISHED_ITEM_STATUSES = frozenset({"incomplete", "in_progress"})


def _refuse_unless_finished(response: Mapping[str, Any], output: list[Any]) -> None:
    """Refuse a response that did not finish: a call item still being written, a
    content filter, or any end but `completed`."""
    for item in output:
        if (
            isinstance(item, Mapping) and item.get("type") == "function_call"
            and one_of(item.get("status"), _UNFINISHED_ITEM_STATUSES)
        ):
            raise truncated(
                SURFACE,
                f"a function_call item has status {item.get('status')}",
                item.get("call_id"),
            )
    status = response.get("status")
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    if status == "incomplete" and one_of(reason, _FILTERED_INCOMPLETE_REASONS):
        raise _refuse(
            AdapterErrorCode.FILTERED_RESPONSE,
            f"the response is incomplete ({reason}): a content filter stopped it",
        )
    # Incomplete with every call item completed still ended early: the model may
    # have meant more calls than these, or more text than this.
    detail = quote(reason) if status == "incomplete" and reason is not None else ""
    refuse_unless_finished(SURFACE, ENDINGS, status, detail=detail)


def _read_call(item: Mapping[str, Any], where: str, *, known_names: Iterable[str]) -> ProposedCall:
    call_id = check_call_id(item.get("call_id"), surface=SURFACE, where=where)
    if item.get("namespace"):
        # toolfence declares no namespaces; reading `name` alone could land a
        # namespaced tool on an unrelated toolfence tool of the same name.
        raise _refuse(
            AdapterErrorCode.UNSUPPORTED_CALL_TYPE,
            f"{where} calls a namespaced function, which toolfence does not declare",
            call_id,
        )
    wire_name = check_tool_name(item.get("name"), surface=SURFACE, where=where)
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise _refuse(
            AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} arguments are not a string", call_id
        )
    return ProposedCall(
        call_id=call_id,
        tool_name=decode_tool_name(wire_name, NAME_RULE, known_names),
        arguments=arguments,
    )


@boundary(SURFACE, AdapterErrorCode.UNSERIALISABLE_OUTPUT)
def write_results(
    proposals: Sequence[ProposedCall], results: Sequence[CallOutcome]
) -> list[dict[str, Any]]:
    """One `{"type": "function_call_output", "call_id", "output"}` input item per
    call, in proposal order; send them as `input` (with `previous_response_id`,
    or after the response's output items).

    Output is JSON text: the output (labelled when untrusted) or
    `{"error": {code, message, details}}`.
    """
    ordered = order_results(proposals, results, surface=SURFACE)
    return [
        {
            "type": "function_call_output",
            "call_id": result.call_id,
            "output": result_text(result, surface=SURFACE),
        }
        for result in ordered
    ]


def export_tools(registry: Registry, context: ServerContext) -> list[dict[str, Any]]:
    """`tools` entries: `{"type": "function", name, description, parameters, strict}`.

    Only the tools exposed to `context` (`common.declared_tools`), in tool-name order.

    Strict when the input schema converts faithfully, as for Chat Completions
    (see `common.strict_parameters_schema` for when and why it falls back).
    """
    declarations: list[dict[str, Any]] = []
    for wire_name, tool in declared_tools(registry, context, NAME_RULE, surface=SURFACE):
        schema = parameters_schema(tool)
        strict_schema, _reason = strict_parameters_schema(schema)
        declarations.append(
            {
                "type": "function",
                "name": wire_name,
                "description": tool.description,
                "parameters": strict_schema if strict_schema is not None else schema,
                "strict": strict_schema is not None,
            }
        )
    return declarations


def request_options(registry: Registry, context: ServerContext) -> dict[str, Any]:
    """Request parameters that go with `export_tools(registry, context)`.

    `parallel_tool_calls: false` when the export holds a write, so the model
    proposes one call per turn and sees each write's outcome before the next;
    empty otherwise (reads may run in parallel, and the API refuses the flag
    on a request with no tools).
    """
    return {"parallel_tool_calls": False} if exports_writes(registry, context) else {}


# ---------------------------------------------------------------- hosted calls

# Built-in tool items, named for the tool type the request declares.
_BUILTIN_ITEMS = {
    "web_search_call": "web_search",
    "file_search_call": "file_search",
    "code_interpreter_call": "code_interpreter",
    "image_generation_call": "image_generation",
    "tool_search_call": "tool_search",  # execution "server"; "client" is refused
    "program": "programmatic_tool_calling",
}
# Results of built-in runs, answering the item whose `call_id` they carry.
_BUILTIN_RESULTS = {
    "tool_search_output": "tool_search",
    "program_output": "programmatic_tool_calling",
}
# Items that call nothing: the answer's text and reasoning, context compaction, tool
# definitions, and results of client-answered calls or approvals echoed from the input.
_INERT_ITEMS = frozenset(
    {
        "message", "reasoning", "compaction", "additional_tools",
        "function_call_output", "computer_call_output", "local_shell_call_output",
        "shell_call_output", "apply_patch_call_output", "custom_tool_call_output",
        "mcp_approval_response",
    }
)
# What `read_proposals` reads or refuses itself.
_PROPOSAL_ITEMS = _CLIENT_ANSWERED_ITEMS | {"function_call"}
KNOWN_ITEMS = (
    _PROPOSAL_ITEMS | _INERT_ITEMS | set(_BUILTIN_ITEMS) | set(_BUILTIN_RESULTS)
    | {"mcp_call", "mcp_list_tools", "mcp_approval_request"}
)
"""Every output item type this surface reads, refuses or knows to call nothing;
any other type is reported by `read_hosted_calls` as an unknown item."""


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_hosted_calls(response: Mapping[str, Any]) -> list[HostedCall]:
    """Every provider-run item of `output`, in output order, as `HostedCall`s.

    Check them with `hosted.hosted_violations(calls, policy)`: the provider
    has already run an `mcp_call` or a web search by the time toolfence reads
    it, so the point is that none goes unreported.
    """
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    output = response.get("output")
    if not isinstance(output, list):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response has no output list")
    calls: list[HostedCall] = []
    for index, item in enumerate(output):
        if not isinstance(item, Mapping):
            raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, f"output[{index}] is not an object")
        hosted = _read_hosted(item)
        if hosted is not None:
            calls.append(hosted)
    return calls


def _read_hosted(item: Mapping[str, Any]) -> HostedCall | None:
    kind = item.get("type")
    item_id = text_or_none(item.get("id"))
    status = text_or_none(item.get("status"))
    if kind in ("mcp_call", "mcp_approval_request"):
        failed = item.get("error") is not None
        return HostedCall(
            surface=SURFACE, kind=kind, server_label=text_or_none(item.get("server_label")),
            tool_name=text_or_none(item.get("name")),
            arguments=arguments_text(item.get("arguments")), item_id=item_id,
            status="failed" if failed and status is None else status,
            output_digest=output_digest(item.get("output")),
            approval_request_id=text_or_none(item.get("approval_request_id")),
        )
    if kind == "mcp_list_tools":
        return HostedCall(
            surface=SURFACE, kind=kind, server_label=text_or_none(item.get("server_label")),
            tool_name=None, arguments=None, item_id=item_id,
            status="failed" if item.get("error") is not None else "completed",
            output_digest=output_digest(item.get("tools")),
        )
    if kind == "tool_search_call" and item.get("execution") == "client":
        return None  # refused by read_proposals: the client would have to answer it
    if one_of(kind, frozenset(_BUILTIN_ITEMS)):
        arguments, output = _builtin_arguments_and_output(str(kind), item)
        return HostedCall(
            surface=SURFACE, kind=str(kind), server_label=None, tool_name=_BUILTIN_ITEMS[str(kind)],
            arguments=arguments_text(arguments), item_id=item_id, status=status,
            output_digest=output_digest(output),
        )
    if one_of(kind, frozenset(_BUILTIN_RESULTS)):
        return HostedCall(
            surface=SURFACE, kind=str(kind), server_label=None,
            tool_name=_BUILTIN_RESULTS[str(kind)], arguments=None,
            item_id=text_or_none(item.get("call_id")), status=status,
            output_digest=output_digest(item.get("result", item.get("tools"))), is_result=True,
        )
    if one_of(kind, _PROPOSAL_ITEMS | _INERT_ITEMS):
        return None
    return unknown_item(SURFACE, kind, item.get("id"))


def _builtin_arguments_and_output(kind: str, item: Mapping[str, Any]) -> tuple[Any, Any]:
    if kind == "web_search_call":
        return item.get("action"), None
    if kind == "file_search_call":
        return {"queries": item.get("queries")}, item.get("results")
    if kind == "code_interpreter_call":
        arguments = without_none({"code": item.get("code"), "container_id": item.get("container_id")})
        return arguments, item.get("outputs")
    if kind == "image_generation_call":
        return without_none({"action": item.get("action"), "size": item.get("size")}), item.get("result")
    if kind == "program":
        return without_none({"code": item.get("code")}), None
    return item.get("arguments"), None  # tool_search_call


def export_mcp_tools(policy: HostedPolicy) -> list[dict[str, Any]]:
    """`tools` entries for the policy's MCP servers, in policy order:
    `{"type": "mcp", "server_label", "server_url", "allowed_tools",
    "require_approval": {"always": {"tool_names"}, "never": {"tool_names"}}}`.

    Append them to `export_tools(...)`; add the server's `authorization` (a
    secret, never part of the policy) to the entry yourself. Tools neither
    allowed nor approval-routed are left out of `allowed_tools`, so the
    provider never offers them to the model.
    """
    entries: list[dict[str, Any]] = []
    for server in policy.servers:
        require_approval: dict[str, Any] = {}
        if server.approval_required:
            require_approval["always"] = {"tool_names": sorted(server.approval_required)}
        if server.allowed_tools - server.approval_required:
            require_approval["never"] = {
                "tool_names": sorted(server.allowed_tools - server.approval_required)
            }
        entries.append(
            {
                "type": "mcp",
                "server_label": server.label,
                "server_url": server.url,
                "allowed_tools": sorted(server.allowed_tools),
                # Tools in neither list would default to "always"; both are given.
                "require_approval": require_approval or "always",
            }
        )
    return entries


def write_approval_response(
    approval_request_id: str, *, approve: bool, reason: str | None = None
) -> dict[str, Any]:
    """The `mcp_approval_response` input item answering an `mcp_approval_request`.

    `approve` is the decision of toolfence's approval flow (this function only
    writes it). Send the item as `input` with `previous_response_id`.
    """
    if not isinstance(approval_request_id, str) or not approval_request_id.strip():
        raise _refuse(AdapterErrorCode.EMPTY_CALL_ID, "an approval response needs the request's id")
    item: dict[str, Any] = {
        "type": "mcp_approval_response",
        "approval_request_id": approval_request_id,
        "approve": approve,
    }
    if reason is not None:
        item["reason"] = reason
    return item
