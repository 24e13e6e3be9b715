"""OpenAI Chat Completions: `choices[0].message.tool_calls` in, `role: "tool"` messages out.

Envelope (what `ChatCompletion.model_dump(mode="json")` and the HTTP API give):
`choices[i].message.tool_calls[j] = {"id", "type": "function",
"function": {"name", "arguments": "<JSON text>"}}` and `choices[i].finish_reason`.

Whole envelope refused (`AdapterError`) when calls cannot be correlated or
answered: no single choice (`multiple_choices`; the caller picks one), a
`tool_calls` finish with no calls, a call list or call that is not the shape
above (`malformed_call_list`), a legacy `function_call` or a `custom` tool call
(`unsupported_call_type`: toolfence declares neither, and answers them
differently), an empty or repeated call id, and any choice that did not finish
(`ENDINGS`, whatever the message holds): `finish_reason: "length"` is
`truncated_response` (naming the last call, the one being written when the
token limit hit: its cut arguments text may still parse, and the calls before
it are a plan the model did not finish), `content_filter` and a
`message.refusal` are `filtered_response`, an unknown finish reason
`unfinished_response`.
Left to the admission gates, per call: the arguments text, verbatim, however
broken (`invalid_arguments_json`), and tool names (`unknown_tool`).
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
    order_results,
    parameters_schema,
    result_text,
    strict_parameters_schema,
)
from executor.providers.endings import Endings, refuse_unless_finished
from executor.providers.hosted import HostedCall

SURFACE = "openai-chat"
# FunctionDefinition.name: "a-z, A-Z, 0-9, or contain underscores and dashes,
# with a maximum length of 64".
NAME_RULE = NameRule(pattern=r"[A-Za-z0-9_-]+", max_length=64)

# `choices[0].finish_reason`; `function_call` (legacy) is refused before this.
ENDINGS = Endings(
    field="finish_reason",
    finished=frozenset({"stop", "tool_calls", "function_call"}),
    truncated=frozenset({"length"}),
    filtered=frozenset({"content_filter"}),
    unfinished=frozenset(),
)

# Every field of the assistant message, and who reads it: `tool_calls` here,
# `content` and `annotations` (citations) the caller's text, `audio` the
# caller's audio, `refusal` refused below, `function_call` refused as legacy.
MESSAGE_FIELDS = frozenset(
    {"content", "refusal", "role", "annotations", "audio", "function_call", "tool_calls"}
)


def _refuse(code: AdapterErrorCode, message: str, call_id: str | None = None) -> AdapterError:
    return AdapterError(code, message, surface=SURFACE, call_id=call_id)


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_proposals(
    response: Mapping[str, Any], *, known_names: Iterable[str] = ()
) -> list[ProposedCall]:
    """The calls of the response's only choice, in the model's order.

    `known_names` (the registry's names) is needed only to decode tool names
    that were too long for the provider and were declared in hashed form.
    """
    known_names = tuple(known_names)  # a generator would run dry after one decode
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response has no choices")
    if len(choices) > 1:
        raise _refuse(
            AdapterErrorCode.MULTIPLE_CHOICES,
            f"{len(choices)} choices; pass a response holding only the one to continue",
        )
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the choice has no message")
    finish_reason = choice.get("finish_reason")
    if message.get("function_call") is not None or finish_reason == "function_call":
        raise _refuse(
            AdapterErrorCode.UNSUPPORTED_CALL_TYPE,
            "legacy function_call; toolfence declares tools, not functions",
        )
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise _refuse(AdapterErrorCode.MALFORMED_CALL_LIST, "tool_calls is not a list")
    last = raw_calls[-1] if raw_calls else None
    refuse_unless_finished(
        SURFACE, ENDINGS, finish_reason,
        call_id=last.get("id") if isinstance(last, Mapping) else None,
        detail=f"{len(raw_calls)} call(s)" if raw_calls else "",
    )
    if isinstance(message.get("refusal"), str) and message.get("refusal"):
        # Structured Outputs' refusal: the model declined, and `content` is null.
        raise _refuse(AdapterErrorCode.FILTERED_RESPONSE, "the message is the model's refusal")
    if not raw_calls:
        if finish_reason == "tool_calls":
            raise _refuse(
                AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS,
                "finish_reason is tool_calls but the message carries no calls",
            )
        return []
    proposals = [
        _read_call(raw, index, known_names=known_names) for index, raw in enumerate(raw_calls)
    ]
    check_unique_ids(proposals, surface=SURFACE)
    return proposals


def _read_call(raw: Any, index: int, *, known_names: Iterable[str]) -> ProposedCall:
    where = f"tool_calls[{index}]"
    if not isinstance(raw, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} is not an object")
    kind = raw.get("type")
    if kind == "custom":
        raise _refuse(
            AdapterErrorCode.UNSUPPORTED_CALL_TYPE,
            f"{where} is a custom tool call; toolfence declares only function tools",
        )
    if kind != "function":
        raise _refuse(AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} is not a function call")
    call_id = check_call_id(raw.get("id"), surface=SURFACE, where=where)
    function = raw.get("function")
    if not isinstance(function, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} has no function", call_id)
    wire_name = check_tool_name(function.get("name"), surface=SURFACE, where=where)
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        # The API always sends JSON *text*; an object here means this is not a
        # Chat Completions envelope (another surface's shape, or a broken proxy).
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
    """One `{"role": "tool", "tool_call_id", "content"}` message per call, in
    proposal order; append them after the assistant message that made the calls.

    Content is JSON text: the output (labelled when untrusted) or
    `{"error": {code, message, details}}`.
    """
    ordered = order_results(proposals, results, surface=SURFACE)
    return [
        {"role": "tool", "tool_call_id": result.call_id, "content": result_text(result, surface=SURFACE)}
        for result in ordered
    ]


def export_tools(registry: Registry, context: ServerContext) -> list[dict[str, Any]]:
    """`tools` entries: `{"type": "function", "function": {name, description,
    parameters, strict}}`.

    Only the tools exposed to `context` (`common.declared_tools`), in tool-name order.

    `strict: true` when the input schema converts faithfully to strict form
    (`common.strict_parameters_schema`); otherwise the schema is sent as pydantic
    wrote it with `strict: false`, because forcing strict form would change what
    arguments mean (an optional field with a non-null default would become one
    the model must fill) or hide constraints from the model.
    """
    declarations: list[dict[str, Any]] = []
    for wire_name, tool in declared_tools(registry, context, NAME_RULE, surface=SURFACE):
        schema = parameters_schema(tool)
        strict_schema, _reason = strict_parameters_schema(schema)
        declarations.append(
            {
                "type": "function",
                "function": {
                    "name": wire_name,
                    "description": tool.description,
                    "parameters": strict_schema if strict_schema is not None else schema,
                    "strict": strict_schema is not None,
                },
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


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_hosted_calls(response: Mapping[str, Any]) -> list[HostedCall]:
    """Always empty: Chat Completions runs no tools itself. (A search model's
    `annotations` are citations in the text, not calls.) Kept so every surface
    answers the same question."""
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    return []
