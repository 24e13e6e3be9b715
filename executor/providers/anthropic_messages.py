"""Anthropic Messages: `tool_use` content blocks in, ONE user message of `tool_result` blocks out.

Envelope (what `Message.model_dump(mode="json")` and the HTTP API give):
`content[i] = {"type": "tool_use", "id": "toolu_…", "name", "input": {…}}` and
`stop_reason`. Arguments arrive as an object, not text, and are passed on as
that object.

Whole envelope refused (`AdapterError`): `content` missing, a `tool_use` stop
with no `tool_use` block, a block that is not the shape above
(`malformed_call_list`, including `input` that is not an object: the API
always sends one), a toolset member call (`unsupported_call_type`: toolfence
declares no toolsets), an empty or repeated id. Server-run blocks are not
proposals: `read_hosted_calls` reads them (`server_tool_use`, `mcp_tool_use`,
`mcp_tool_result`, `web_search_tool_result` and the other `*_tool_result`
blocks of server tools, `mcp_tool_listing`) for the hosted-tool check, and
reports a block of a type it does not know (`is_known_block`) as an unknown
one; thinking, text and the other inert blocks are skipped.

Refused before admission, whatever the content holds, a message that did not
finish (`ENDINGS`): `max_tokens` or `model_context_window_exceeded` is
`truncated_response` (the last block, when it is a `tool_use`, was being
written when the limit hit and is named: its partial input is an object that
may still validate, and the blocks before it are a plan the model did not
finish), `refusal` is `filtered_response`, an unknown stop reason
`unfinished_response`. `pause_turn` is not refused: `paused(response)` says
the caller must send the message back to continue the turn. Left to the admission
gates, per call: tool names (`unknown_tool`) and the arguments.
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
    is_failure,
    one_of,
    order_results,
    parameters_schema,
    result_text,
)
from executor.providers.endings import Ending, Endings, refuse_unless_finished
from executor.providers.hosted import (
    HostedCall,
    HostedPolicy,
    arguments_text,
    output_digest,
    text_or_none,
    unknown_item,
)

SURFACE = "anthropic"
# Tool names must match ^[a-zA-Z0-9_-]{1,64}$ (Anthropic's tool-use docs; newer
# models accept 128, 64 is what every model accepts).
NAME_RULE = NameRule(pattern=r"[A-Za-z0-9_-]+", max_length=64)

ENDINGS = Endings(
    field="stop_reason",
    finished=frozenset({"end_turn", "stop_sequence", "tool_use"}),
    paused=frozenset({"pause_turn"}),
    truncated=frozenset({"max_tokens", "model_context_window_exceeded"}),
    filtered=frozenset({"refusal"}),
    unfinished=frozenset(),
)


PAUSE_TURN = "pause_turn"


def paused(response: Mapping[str, Any]) -> bool:
    """Did the server pause a long-running turn (`stop_reason: "pause_turn"`,
    `ENDINGS`' one paused end)?

    Not a refusal and not a finished turn: `read_proposals` reads the message
    as usual (usually no `tool_use` block; its server-tool blocks are read by
    `read_hosted_calls`), and the caller must send the message back as the
    assistant turn, unchanged, for the server to continue it. A turn that
    treats it as the final answer ends with a partial one.
    """
    return isinstance(response, Mapping) and ENDINGS.classify(response.get("stop_reason")) is Ending.PAUSED


def _refuse(code: AdapterErrorCode, message: str, call_id: str | None = None) -> AdapterError:
    return AdapterError(code, message, surface=SURFACE, call_id=call_id)


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_proposals(
    response: Mapping[str, Any], *, known_names: Iterable[str] = ()
) -> list[ProposedCall]:
    """The `tool_use` blocks of `content`, in content order.

    `known_names` (the registry's names) is needed only to decode tool names
    that were too long for the provider and were declared in hashed form.
    """
    known_names = tuple(known_names)  # a generator would run dry after one decode
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    content = response.get("content")
    if not isinstance(content, list):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the message has no content list")
    stop_reason = response.get("stop_reason")
    # The end first, whatever the blocks hold: a cut response's last block may be
    # malformed because it was cut, and is refused as cut (0196).
    tool_uses = sum(1 for b in content if isinstance(b, Mapping) and b.get("type") == "tool_use")
    last = content[-1] if content else None
    refuse_unless_finished(
        SURFACE, ENDINGS, stop_reason,
        call_id=last.get("id") if isinstance(last, Mapping) and last.get("type") == "tool_use" else None,
        detail=f"{tool_uses} tool_use block(s)" if tool_uses else "",
    )
    proposals: list[ProposedCall] = []
    for index, block in enumerate(content):
        where = f"content[{index}]"
        if not isinstance(block, Mapping):
            raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, f"{where} is not an object")
        if block.get("type") != "tool_use":
            continue
        proposals.append(_read_call(block, where, known_names=known_names))
    if not proposals and stop_reason == "tool_use":
        raise _refuse(
            AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS,
            "stop_reason is tool_use but the message has no tool_use block",
        )
    check_unique_ids(proposals, surface=SURFACE)
    return proposals


def _read_call(block: Mapping[str, Any], where: str, *, known_names: Iterable[str]) -> ProposedCall:
    call_id = check_call_id(block.get("id"), surface=SURFACE, where=where)
    if block.get("toolset_name"):
        raise _refuse(
            AdapterErrorCode.UNSUPPORTED_CALL_TYPE,
            f"{where} calls a toolset member, which toolfence does not declare",
            call_id,
        )
    wire_name = check_tool_name(block.get("name"), surface=SURFACE, where=where)
    arguments = block.get("input")
    if not isinstance(arguments, Mapping):
        raise _refuse(
            AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} input is not an object", call_id
        )
    return ProposedCall(
        call_id=call_id,
        tool_name=decode_tool_name(wire_name, NAME_RULE, known_names),
        arguments=dict(arguments),
    )


@boundary(SURFACE, AdapterErrorCode.UNSERIALISABLE_OUTPUT)
def write_results(
    proposals: Sequence[ProposedCall], results: Sequence[CallOutcome]
) -> list[dict[str, Any]]:
    """`[{"role": "user", "content": [tool_result, …]}]`: one message holding a
    `{"type": "tool_result", "tool_use_id", "is_error", "content"}` block per
    call, in proposal order (the API wants all results of a turn in the one
    user message that follows it). Empty when there were no calls: a user
    message with no content is invalid.

    Content is JSON text: the output (labelled when untrusted) or
    `{"error": {code, message, details}}` with `is_error: true`.
    """
    ordered = order_results(proposals, results, surface=SURFACE)
    if not ordered:
        return []
    blocks = [
        {
            "type": "tool_result",
            "tool_use_id": result.call_id,
            "is_error": is_failure(result),
            "content": result_text(result, surface=SURFACE),
        }
        for result in ordered
    ]
    return [{"role": "user", "content": blocks}]


def export_tools(registry: Registry, context: ServerContext) -> list[dict[str, Any]]:
    """`tools` entries: `{"name", "description", "input_schema"}`.

    Only the tools exposed to `context` (`common.declared_tools`), in tool-name order.

    The schema goes as pydantic wrote it (JSON Schema 2020-12, which the API
    takes). Anthropic's own `strict` tool mode is not requested: it has its own
    schema subset, and the admission gate validates every call regardless.
    """
    return [
        {
            "name": wire_name,
            "description": tool.description,
            "input_schema": parameters_schema(tool),
        }
        for wire_name, tool in declared_tools(registry, context, NAME_RULE, surface=SURFACE)
    ]


def request_options(registry: Registry, context: ServerContext) -> dict[str, Any]:
    """Request parameters that go with `export_tools(registry, context)`.

    `tool_choice: {"type": "auto", "disable_parallel_tool_use": true}` when the
    export holds a write, so the model proposes one call per turn and sees each
    write's outcome before the next; empty otherwise.
    """
    if not exports_writes(registry, context):
        return {}
    return {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}


# ---------------------------------------------------------------- hosted calls

_HOSTED_USE_BLOCKS = frozenset({"server_tool_use", "mcp_tool_use"})
# Blocks that call nothing: text, reasoning, a file put in the container, context
# compaction, the boundary of a model fallback, and `tool_use`, read by read_proposals.
_INERT_BLOCKS = frozenset(
    {"text", "thinking", "redacted_thinking", "container_upload", "compaction", "fallback", "tool_use"}
)
_LISTING_BLOCK = "mcp_tool_listing"


def is_known_block(kind: object) -> bool:
    """Does this surface read, report or knowingly skip a content block of type `kind`?
    Any other block is reported by `read_hosted_calls` as an unknown item."""
    return one_of(kind, _INERT_BLOCKS | _HOSTED_USE_BLOCKS | {_LISTING_BLOCK}) or _is_result_block(kind)


def _is_result_block(kind: object) -> bool:
    return isinstance(kind, str) and kind.endswith("_tool_result") and kind != "tool_result"


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_hosted_calls(response: Mapping[str, Any]) -> list[HostedCall]:
    """Every server-run block of `content`, in content order, as `HostedCall`s.

    A result block (`mcp_tool_result`, `web_search_tool_result`, …) carries the
    id of the use it answers; it is given that use's server and tool name, when
    the use is in the same message, and a digest of its content.
    """
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    content = response.get("content")
    if not isinstance(content, list):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the message has no content list")
    calls: list[HostedCall] = []
    uses: dict[str, HostedCall] = {}
    for index, block in enumerate(content):
        if not isinstance(block, Mapping):
            raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, f"content[{index}] is not an object")
        kind = block.get("type")
        if one_of(kind, _HOSTED_USE_BLOCKS):
            use = HostedCall(
                surface=SURFACE, kind=str(kind),
                server_label=text_or_none(block.get("server_name")) if kind == "mcp_tool_use" else None,
                tool_name=text_or_none(block.get("name")),
                arguments=arguments_text(block.get("input")),
                item_id=text_or_none(block.get("id")), status=None, output_digest=None,
            )
            calls.append(use)
            if use.item_id is not None:
                uses[use.item_id] = use
        elif kind == _LISTING_BLOCK:
            calls.append(
                HostedCall(
                    surface=SURFACE, kind=_LISTING_BLOCK,
                    server_label=text_or_none(block.get("mcp_server_name")), tool_name=None,
                    arguments=None, item_id=None, status="completed",
                    output_digest=output_digest(block.get("tools")),
                )
            )
        elif not is_known_block(kind):
            calls.append(unknown_item(SURFACE, kind, block.get("id")))
        elif _is_result_block(kind):
            answers = text_or_none(block.get("tool_use_id"))
            answered = uses.get(answers) if answers is not None else None
            result = block.get("content")
            errored = block.get("is_error") is True or (
                isinstance(result, Mapping) and (text_or_none(result.get("type")) or "").endswith("_error")
            )
            calls.append(
                HostedCall(
                    surface=SURFACE, kind=str(kind),
                    server_label=answered.server_label if answered else None,
                    tool_name=answered.tool_name if answered else None,
                    arguments=None, item_id=answers,
                    status="error" if errored else "completed",
                    output_digest=output_digest(result), is_result=True,
                )
            )
    return calls


def export_mcp_servers(policy: HostedPolicy) -> list[dict[str, Any]]:
    """The request's `mcp_servers` (MCP connector beta), in policy order:
    `{"type": "url", "url", "name", "tool_configuration": {"enabled": true,
    "allowed_tools"}}`.

    Only the tools that need no approval are enabled: the connector runs a
    tool the moment the model calls it, with no pause for an approval, so a
    tool in `approval_required` cannot run safely through it. Add the
    server's `authorization_token` (a secret, never part of the policy)
    yourself.
    """
    return [
        {
            "type": "url",
            "url": server.url,
            "name": server.label,
            "tool_configuration": {
                "enabled": True,
                "allowed_tools": sorted(server.allowed_tools - server.approval_required),
            },
        }
        for server in policy.servers
    ]
