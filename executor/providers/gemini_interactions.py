"""Gemini Interactions: `function_call` steps in, `function_result` steps out.

Envelope (the `Interaction` resource, snake_case in both the HTTP API and the
SDK's `google.genai.interactions.Interaction`): `status` and
`steps[i] = {"type": "function_call", "id", "name", "arguments": {…}}`.
An interaction's steps can already hold `function_result` steps (inputs sent
with it); a call is proposed only when no result for its id follows it.
Arguments arrive as an object and are passed on as that object.

Whole envelope refused (`AdapterError`): `steps` not a list, status
`requires_action` with no unanswered call (`tool_calls_without_calls`), a call
step not of the shape above (`malformed_call_list`), an empty or repeated id.
Server-run steps (search, code execution, URL context, MCP server tools, …)
are not proposals: `read_hosted_calls` reads them, and reports a step of a
type it does not know (`is_known_step`) as an unknown one; thoughts, model
output and user input are skipped. Refused before admission, whatever the
steps hold, an interaction that did not finish (`ENDINGS`): `incomplete`,
`budget_exceeded`, `requires_continuation` are `truncated_response` (the last
unanswered call is named), `failed`, `cancelled`, `queued`, `in_progress`,
`idle` and unknown statuses `unfinished_response`. Left to the admission gates, per
call: tool names (`unknown_tool`) and the arguments.
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
    encode_tool_name,
    is_failure,
    one_of,
    order_results,
    parameters_schema,
    result_text,
)
from executor.providers.endings import Endings, refuse_unless_finished
from executor.providers.hosted import (
    HostedCall,
    arguments_text,
    output_digest,
    text_or_none,
    unknown_item,
)

SURFACE = "gemini-interactions"
# The Interactions SDK documents no name rule; its functions reach the same
# models as GenerateContent, so the same rule applies.
NAME_RULE = NameRule(pattern=r"[A-Za-z_][A-Za-z0-9_.:-]*", max_length=64)


# The interaction's `status`, every value of the SDK's `InteractionStatus`.
ENDINGS = Endings(
    field="status",
    finished=frozenset({"completed", "requires_action"}),
    # budget_exceeded: a limit ended it; requires_continuation: the per-request
    # limit did, and a later request may continue it.
    truncated=frozenset({"incomplete", "budget_exceeded", "requires_continuation"}),
    filtered=frozenset(),
    unfinished=frozenset({"in_progress", "failed", "cancelled", "queued", "idle"}),
)

# Steps that call nothing: the model's text and thoughts, the user's input.
_INERT_STEPS = frozenset({"model_output", "thought", "user_input"})


def is_known_step(kind: object) -> bool:
    """Does this surface read, report or knowingly skip a step of type `kind`? Every
    `<tool>_call` / `<tool>_result` step is read (as a function call or a hosted
    one); any other step type is reported by `read_hosted_calls` as an unknown item."""
    return one_of(kind, _INERT_STEPS) or (
        isinstance(kind, str) and (kind.endswith("_call") or kind.endswith("_result"))
    )


def _refuse(code: AdapterErrorCode, message: str, call_id: str | None = None) -> AdapterError:
    return AdapterError(code, message, surface=SURFACE, call_id=call_id)


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_proposals(
    response: Mapping[str, Any], *, known_names: Iterable[str] = ()
) -> list[ProposedCall]:
    """The unanswered `function_call` steps, in step order.

    `known_names` (the registry's names) is needed only to decode tool names
    that were too long for the provider and were declared in hashed form.
    """
    known_names = tuple(known_names)  # a generator would run dry after one decode
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the interaction is not an object")
    steps = response.get("steps")
    if steps is None:
        steps = []
    if not isinstance(steps, list):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "steps is not a list")
    calls: list[ProposedCall] = []
    called: set[str] = set()
    answered: set[str] = set()
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        if not isinstance(step, Mapping):
            raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, f"{where} is not an object")
        kind = step.get("type")
        if kind == "function_call":
            call = _read_call(step, where, known_names=known_names)
            calls.append(call)
            called.add(call.call_id)
        elif kind == "function_result":
            call_id = step.get("call_id")
            # Only a result *after* its call answers it.
            if isinstance(call_id, str) and call_id in called:
                answered.add(call_id)
    check_unique_ids(calls, surface=SURFACE)
    pending = [call for call in calls if call.call_id not in answered]
    if not pending and response.get("status") == "requires_action":
        raise _refuse(
            AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS,
            "status is requires_action but no function_call step awaits a result",
        )
    refuse_unless_finished(
        SURFACE, ENDINGS, response.get("status"),
        call_id=pending[-1].call_id if pending else None,
        detail=f"{len(pending)} unanswered call(s)" if pending else "",
    )
    return pending


def _read_call(step: Mapping[str, Any], where: str, *, known_names: Iterable[str]) -> ProposedCall:
    call_id = check_call_id(step.get("id"), surface=SURFACE, where=where)
    wire_name = check_tool_name(step.get("name"), surface=SURFACE, where=where)
    arguments = step.get("arguments")
    if not isinstance(arguments, Mapping):
        raise _refuse(
            AdapterErrorCode.MALFORMED_CALL_LIST, f"{where} arguments are not an object", call_id
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
    """`{"type": "function_result", "call_id", "name", "result", "is_error"}` steps,
    one per call in proposal order; send them as `input` with
    `previous_interaction_id` set to the interaction that made the calls.

    `result` is JSON text: the output (labelled when untrusted) or
    `{"error": {code, message, details}}` with `is_error: true`.
    """
    ordered = order_results(proposals, results, surface=SURFACE)
    return [
        {
            "type": "function_result",
            "call_id": call.call_id,
            "name": encode_tool_name(call.tool_name, NAME_RULE),
            "result": result_text(result, surface=SURFACE),
            "is_error": is_failure(result),
        }
        for call, result in zip(proposals, ordered, strict=True)
    ]


def export_tools(registry: Registry, context: ServerContext) -> list[dict[str, Any]]:
    """`tools` entries: `{"type": "function", "name", "description", "parameters"}`.

    Only the tools exposed to `context` (`common.declared_tools`), in tool-name order.
    """
    return [
        {
            "type": "function",
            "name": wire_name,
            "description": tool.description,
            "parameters": parameters_schema(tool),
        }
        for wire_name, tool in declared_tools(registry, context, NAME_RULE, surface=SURFACE)
    ]


def request_options(registry: Registry, context: ServerContext) -> dict[str, Any]:
    """Request parameters that go with `export_tools(registry, context)`: none.

    The Interactions API has no switch for one call per turn; writes of one request
    still run in proposal order, each after the previous one is terminal.
    """
    return {}


# ---------------------------------------------------------------- hosted calls


@boundary(SURFACE, AdapterErrorCode.MALFORMED_ENVELOPE)
def read_hosted_calls(response: Mapping[str, Any]) -> list[HostedCall]:
    """Every server-run step, in step order, as `HostedCall`s.

    A `<tool>_call` step other than `function_call` is a call of the built-in
    tool `<tool>` (`google_search`, `code_execution`, `url_context`, …), or of
    an MCP server's tool for `mcp_server_tool_call`; a `<tool>_result` step
    other than `function_result` is its result, matched by `call_id`.
    """
    if not isinstance(response, Mapping):
        raise _refuse(AdapterErrorCode.MALFORMED_ENVELOPE, "the interaction is not an object")
    steps = response.get("steps")
    calls: list[HostedCall] = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, Mapping):
            continue
        kind = step.get("type")
        if not is_known_step(kind):
            calls.append(unknown_item(SURFACE, kind, step.get("id")))
            continue
        if not isinstance(kind, str) or kind in ("function_call", "function_result"):
            continue
        mcp = kind.startswith("mcp_server_tool_")
        if kind.endswith("_call"):
            calls.append(
                HostedCall(
                    surface=SURFACE, kind=kind,
                    server_label=text_or_none(step.get("server_name")) if mcp else None,
                    tool_name=text_or_none(step.get("name")) if mcp else kind[: -len("_call")],
                    arguments=arguments_text(step.get("arguments")),
                    item_id=text_or_none(step.get("id")), status=None, output_digest=None,
                )
            )
        elif kind.endswith("_result"):
            calls.append(
                HostedCall(
                    surface=SURFACE, kind=kind,
                    server_label=text_or_none(step.get("server_name")) if mcp else None,
                    tool_name=text_or_none(step.get("name")) if mcp else kind[: -len("_result")],
                    arguments=None, item_id=text_or_none(step.get("call_id")),
                    status="error" if step.get("is_error") is True else "completed",
                    output_digest=output_digest(step.get("result")), is_result=True,
                )
            )
    return calls
