"""Gemini GenerateContent: `functionCall` parts in, one `user` content of `functionResponse` parts out.

Envelope (the HTTP API writes camelCase, the SDK's `model_dump` snake_case; both
are read, and a part carrying both spellings of one field is refused):
`candidates[0].content.parts[i].functionCall = {"id"?, "name", "args"?}` and
`candidates[0].finishReason`. Arguments arrive as an object and are passed on
as that object (absent `args` is an empty object).

Call ids: the model may omit `id`. toolfence then synthesises a deterministic
one, `SYNTHETIC_ID_PREFIX + "<ordinal>-<digest>"`, from the call's position,
wire name and arguments, so reading the same response twice gives the same
ids. The write-back carries the model's `id` only when the model gave one
(a synthetic id means nothing to the API; Gemini then pairs responses with
calls by order and name) and always carries the `name` the model called.
A model-given id that starts with the synthetic prefix is refused
(`reserved_call_id`): it could not be told apart from a synthetic one.

Whole envelope refused (`AdapterError`): more than one candidate
(`multiple_choices`; the caller picks one), a `MALFORMED_FUNCTION_CALL` or
`UNEXPECTED_TOOL_CALL` finish with no call (`tool_calls_without_calls`), a
`functionCall` that is not the shape above (`malformed_call_list`), an empty
or repeated id. No candidates is a response with no calls, unless the prompt
was blocked (`promptFeedback.blockReason`: `filtered_response`). Code the model
ran through the built-in code execution tool (`executableCode` and
`codeExecutionResult` parts) and server-side tool calls (`toolCall` /
`toolResponse` parts: Google Search, URL context, ...) are not proposals:
`read_hosted_calls` reads them, and reports a part field outside
`KNOWN_PART_FIELDS` as an unknown item. Refused before admission, whatever
the candidate holds, a finish that is not `STOP` (`ENDINGS`): `MAX_TOKENS`,
`CONTINUATION`, `TOO_MANY_TOOL_CALLS` are `truncated_response` (the last call
is named: every `functionCall` part is a whole object, but the model may have
meant more calls than these), `SAFETY`, `RECITATION` and the other blocks
`filtered_response`, the rest and unknown finishes `unfinished_response`.
Also `truncated_response`: a `functionCall` that says it is not whole
(`willContinue: true`, or `partialArgs`: its arguments are still being
streamed; named by its id). toolfence
assembles no streamed calls: pass the final, aggregated response. Left to the
admission gates, per call: tool names (`unknown_tool`) and the arguments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from executor.core.tools import Registry
from executor.core.types import ProposedCall, ServerContext, Succeeded
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
    encode_tool_name,
    error_payload,
    get_field,
    one_of,
    order_results,
    output_payload,
    parameters_schema,
    quote,
    truncated,
)
from executor.providers.endings import Endings, refuse_unless_finished
from executor.providers.hosted import (
    HostedCall,
    arguments_text,
    output_digest,
    text_or_none,
    unknown_item,
)

SURFACE = "gemini"
# FunctionDeclaration.name: starts with a letter or an underscore; letters,
# digits, underscores, dots, colons and dashes. The SDK documents 128
# characters; 64 is what Vertex AI documented and every model accepts.
NAME_RULE = NameRule(pattern=r"[A-Za-z_][A-Za-z0-9_.:-]*", max_length=64)

SYNTHETIC_ID_PREFIX = "toolfence-gemini-call-"

# Finish reasons meaning "the model tried to call a function" with no call to show.
_CALL_FAILURE_FINISHES = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"})

# `candidates[0].finishReason`, every value of the SDK's `FinishReason`.
ENDINGS = Endings(
    field="finishReason",
    finished=frozenset({"STOP"}),
    # CONTINUATION: the per-request token limit, to be continued with a token;
    # TOO_MANY_TOOL_CALLS: the server-side tool loop stopped before the answer.
    truncated=frozenset({"MAX_TOKENS", "CONTINUATION", "TOO_MANY_TOOL_CALLS"}),
    filtered=frozenset(
        {
            "SAFETY", "RECITATION", "LANGUAGE", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
            "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION", "ESCALATION",
            "PUP_LIMITED_DISABLED", "MODEL_ARMOR",
        }
    ),
    unfinished=_CALL_FAILURE_FINISHES | {
        "FINISH_REASON_UNSPECIFIED", "OTHER", "IMAGE_OTHER", "NO_IMAGE",
        "MISSING_THOUGHT_SIGNATURE", "MALFORMED_RESPONSE",
    },
)


def _refuse(code: AdapterErrorCode, message: str, call_id: str | None = None) -> AdapterError:
    return AdapterError(code, message, surface=SURFACE, call_id=call_id)


def _get(obj: Mapping[str, Any], snake: str, camel: str, where: str) -> Any:
    return get_field(obj, snake, camel, surface=SURFACE, where=where)


def synthetic_call_id(ordinal: int, wire_name: str, arguments: Mapping[str, Any]) -> str:
    """A stable id for a call the model gave none: same response, same id.

    Lone surrogates in the name or arguments are hashed as written
    (`surrogatepass`): the id is hex either way, and the gates refuse the text.
    Arguments nested too deeply to serialise leave the call with no identity to
    write a result back under: refused as a malformed call.
    """
    try:
        material = json.dumps(
            [ordinal, wire_name, arguments], sort_keys=True, ensure_ascii=False, default=repr
        )
    except (RecursionError, ValueError, TypeError):
        raise _refuse(
            AdapterErrorCode.MALFORMED_CALL_LIST,
            f"call {ordinal} has no id and arguments that cannot be serialised to derive one",
        ) from None
    digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{SYNTHETIC_ID_PREFIX}{ordinal}-{digest}"


def is_synthetic_call_id(call_id: str) -> bool:
    return call_id.startswith(SYNTHETIC_ID_PREFIX)


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_proposals(
    response: Mapping[str, Any], *, known_names: Iterable[str] = ()
) -> list[ProposedCall]:
    """The `functionCall` parts of the only candidate, in part order.

    `known_names` (the registry's names) is needed only to decode tool names
    that were too long for the provider and were declared in hashed form.
    """
    known_names = tuple(known_names)  # a generator would run dry after one decode
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    candidates = response.get("candidates")
    if candidates is None or candidates == []:
        _refuse_if_blocked(response)
        return []
    if not isinstance(candidates, list):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "candidates is not a list")
    if len(candidates) > 1:
        raise _refuse(
            AdapterErrorCode.MULTIPLE_CHOICES,
            f"{len(candidates)} candidates; pass a response holding only the one to continue",
        )
    candidate = candidates[0]
    if not isinstance(candidate, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the candidate is not an object")
    finish_reason = _get(candidate, "finish_reason", "finishReason", "the candidate")
    content = candidate.get("content")
    parts: Any = None
    if content is not None:
        if not isinstance(content, Mapping):
            raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the content is not an object")
        parts = content.get("parts")
    if parts is None:
        parts = []
    if not isinstance(parts, list):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "parts is not a list")
    proposals: list[ProposedCall] = []
    for index, part in enumerate(parts):
        where = f"parts[{index}]"
        if not isinstance(part, Mapping):
            raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, f"{where} is not an object")
        raw_call = _get(part, "function_call", "functionCall", where)
        if raw_call is None:
            continue
        proposals.append(
            _read_call(raw_call, len(proposals), where, known_names=known_names)
        )
    if not proposals and one_of(finish_reason, _CALL_FAILURE_FINISHES):
        raise _refuse(
            AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS,
            f"finishReason is {finish_reason} and no functionCall part survived",
        )
    refuse_unless_finished(
        SURFACE, ENDINGS, finish_reason,
        call_id=proposals[-1].call_id if proposals else None,
        detail=f"{len(proposals)} call(s)" if proposals else "",
    )
    check_unique_ids(proposals, surface=SURFACE)
    return proposals


def _refuse_if_blocked(response: Mapping[str, Any]) -> None:
    """No candidate because the prompt was blocked (`promptFeedback.blockReason`):
    refused as filtered. No candidate and no block reason is a response with no calls."""
    feedback = _get(response, "prompt_feedback", "promptFeedback", "the response")
    if not isinstance(feedback, Mapping):
        return
    reason = _get(feedback, "block_reason", "blockReason", "promptFeedback")
    if reason is not None:
        raise _refuse(
            AdapterErrorCode.FILTERED_RESPONSE,
            f"the prompt was blocked ({quote(reason)}); the response has no candidate",
        )


def _read_call(
    raw: Any, ordinal: int, where: str, *, known_names: Iterable[str]
) -> ProposedCall:
    if not isinstance(raw, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} functionCall is not an object")
    wire_name = check_tool_name(raw.get("name"), surface=SURFACE, where=where)
    arguments = raw.get("args")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} args is not an object")
    given_id = raw.get("id")
    will_continue = _get(raw, "will_continue", "willContinue", where)
    partial_args = _get(raw, "partial_args", "partialArgs", where)
    if will_continue is True or partial_args:
        # Streamed function-call arguments (Gemini 3): this part is one chunk of a
        # call whose arguments are not all here, whatever `args` holds so far.
        raise truncated(
            SURFACE,
            f"{where} functionCall is not whole "
            f"({'willContinue' if will_continue is True else 'partialArgs'})",
            given_id,
        )
    if given_id is None:
        call_id = synthetic_call_id(ordinal, wire_name, arguments)
    else:
        call_id = check_call_id(given_id, surface=SURFACE, where=where)
        if is_synthetic_call_id(call_id):
            raise _refuse(
                AdapterErrorCode.RESERVED_CALL_ID,
                f"{where} id {quote(call_id)} uses toolfence's synthetic-id prefix",
                call_id,
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
    """`[{"role": "user", "parts": [{"functionResponse": {"id"?, "name",
    "response"}}, …]}]`: one content, one part per call, in proposal order.
    Empty when there were no calls.

    `response` is `{"output": …}` on success (labelled when untrusted) and
    `{"error": {code, message, details}}` on failure, the two keys the API
    documents for a function's output and its error.
    """
    ordered = order_results(proposals, results, surface=SURFACE)
    if not ordered:
        return []
    parts: list[dict[str, Any]] = []
    for call, result in zip(proposals, ordered, strict=True):
        function_response: dict[str, Any] = {}
        if not is_synthetic_call_id(call.call_id):
            function_response["id"] = call.call_id
        function_response["name"] = encode_tool_name(call.tool_name, NAME_RULE)
        if isinstance(result, Succeeded):
            function_response["response"] = {"output": output_payload(result, surface=SURFACE)}
        else:
            function_response["response"] = error_payload(result.error)
        parts.append({"functionResponse": function_response})
    return [{"role": "user", "parts": parts}]


def export_tools(registry: Registry, context: ServerContext) -> list[dict[str, Any]]:
    """`tools`: `[{"functionDeclarations": [{name, description, parametersJsonSchema}]}]`,
    one Tool holding every function (empty list when there are none).

    Only the tools exposed to `context` (`common.declared_tools`), in tool-name order.

    `parametersJsonSchema` takes the JSON Schema as pydantic wrote it; the
    older `parameters` field wants an OpenAPI subset that would need converting.
    """
    declarations = [
        {
            "name": wire_name,
            "description": tool.description,
            "parametersJsonSchema": parameters_schema(tool),
        }
        for wire_name, tool in declared_tools(registry, context, NAME_RULE, surface=SURFACE)
    ]
    return [{"functionDeclarations": declarations}] if declarations else []


def request_options(registry: Registry, context: ServerContext) -> dict[str, Any]:
    """Request parameters that go with `export_tools(registry, context)`: none.

    GenerateContent has no switch for one call per turn; writes of one request
    still run in proposal order, each after the previous one is terminal.
    """
    return {}


# ---------------------------------------------------------------- hosted calls

CODE_EXECUTION = "code_execution"

# Server-side tool calls (`toolCall` parts, echoed back by the client, never run
# by it), named for the built-in tool by their `toolType`.
_SERVER_TOOL_TYPES = {
    "GOOGLE_SEARCH_WEB": "google_search",
    "GOOGLE_SEARCH_IMAGE": "google_search",
    "URL_CONTEXT": "url_context",
    "GOOGLE_MAPS": "google_maps",
    "FILE_SEARCH": "file_search",
    "MEDIA_PROCESSING": "media_processing",
}
# Every field of a `Part` (snake_case), and who reads it: `function_call` read_proposals;
# `executable_code`, `code_execution_result`, `tool_call` and `tool_response` below;
# the rest is content or its metadata (text, thoughts, media, an echoed function
# response). A part field outside this set is reported as an unknown item.
KNOWN_PART_FIELDS = frozenset(
    {
        "function_call", "executable_code", "code_execution_result", "tool_call", "tool_response",
        "text", "thought", "thought_signature", "inline_data", "file_data", "function_response",
        "video_metadata", "media_resolution", "part_metadata", "audio_transcription",
        "media_processing", "speech_metadata", "document_metadata", "spreadsheet_metadata",
        "audio_metadata",
    }
)


def _snake(key: str) -> str:
    return "".join(f"_{char.lower()}" if char.isupper() else char for char in key)


def _server_tool_part(part: Mapping[str, Any], where: str) -> list[HostedCall]:
    found: list[HostedCall] = []
    call = _get(part, "tool_call", "toolCall", where)
    if isinstance(call, Mapping):
        tool_type = _get(call, "tool_type", "toolType", where)
        tool = _SERVER_TOOL_TYPES.get(tool_type) if isinstance(tool_type, str) else None
        if tool is None:
            named = f"tool_call {tool_type}" if isinstance(tool_type, str) else "tool_call"
            found.append(unknown_item(SURFACE, named, call.get("id")))
        else:
            found.append(
                HostedCall(
                    surface=SURFACE, kind="tool_call", server_label=None, tool_name=tool,
                    arguments=arguments_text(call.get("args")),
                    item_id=text_or_none(call.get("id")), status=None, output_digest=None,
                )
            )
    response = _get(part, "tool_response", "toolResponse", where)
    if isinstance(response, Mapping):
        tool_type = _get(response, "tool_type", "toolType", where)
        found.append(
            HostedCall(
                surface=SURFACE, kind="tool_response", server_label=None,
                tool_name=_SERVER_TOOL_TYPES.get(tool_type) if isinstance(tool_type, str) else None,
                arguments=None, item_id=text_or_none(response.get("id")), status="completed",
                output_digest=output_digest(response.get("response")), is_result=True,
            )
        )
    return found


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_hosted_calls(response: Mapping[str, Any]) -> list[HostedCall]:
    """The only candidate's provider-run parts, in part order, as `HostedCall`s:
    `executableCode` / `codeExecutionResult` (the built-in tool `code_execution`),
    `toolCall` / `toolResponse` (server-side tools such as Google Search, by
    `toolType`), and a part field the surface does not know (an unknown item)."""
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the response is not an object")
    candidates = response.get("candidates")
    if not isinstance(candidates, list) or len(candidates) != 1:
        # None or [] (a blocked prompt) ran nothing; several are refused by read_proposals.
        return []
    candidate = candidates[0]
    content = candidate.get("content") if isinstance(candidate, Mapping) else None
    parts = content.get("parts") if isinstance(content, Mapping) else None
    calls: list[HostedCall] = []
    for index, part in enumerate(parts if isinstance(parts, list) else []):
        if not isinstance(part, Mapping):
            continue
        where = f"parts[{index}]"
        calls.extend(
            unknown_item(SURFACE, key)
            for key, value in part.items()
            if value is not None and not (isinstance(key, str) and _snake(key) in KNOWN_PART_FIELDS)
        )
        calls.extend(_server_tool_part(part, where))
        code = _get(part, "executable_code", "executableCode", where)
        if isinstance(code, Mapping):
            calls.append(
                HostedCall(
                    surface=SURFACE, kind="executable_code", server_label=None,
                    tool_name=CODE_EXECUTION,
                    arguments=arguments_text(
                        {"language": code.get("language"), "code": code.get("code")}
                    ),
                    item_id=text_or_none(code.get("id")), status=None, output_digest=None,
                )
            )
        result = _get(part, "code_execution_result", "codeExecutionResult", where)
        if isinstance(result, Mapping):
            calls.append(
                HostedCall(
                    surface=SURFACE, kind="code_execution_result", server_label=None,
                    tool_name=CODE_EXECUTION, arguments=None,
                    item_id=text_or_none(result.get("id")),
                    status=text_or_none(result.get("outcome")),
                    output_digest=output_digest(result.get("output")), is_result=True,
                )
            )
    return calls
