"""The turn contract (pure): what one model output means.

JSON mode, for drivers without native tool calling: each output is exactly one
JSON object holding `{"tool_calls": [...]}` or `{"final": "..."}`. `{}`,
`{"tool_calls": []}` and `{"final": ""}` all mean "nothing more to do" and are
normalised, not errors; both keys, neither key (on a non-empty object), prose,
a truncated object or a malformed call list are contract errors. A contract
error keeps the first 500 characters of the output for diagnosis; the output
itself is never stored.

Native mode: the provider's own tool calls, read by the surface's adapter
(`read_proposals`), the text blocks as the final answer.

A tool name the registry does not know is *not* a contract error: the call is
proposed as written, and admission answers it `unknown_tool` (the model is told,
like every other refused call).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from executor.core.types import ProposedCall

EXCERPT_CHARS = 500
MAX_CALL_ID_CHARS = 64


@dataclass(frozen=True)
class ToolCalls:
    proposals: tuple[ProposedCall, ...]


@dataclass(frozen=True)
class Final:
    text: str


@dataclass(frozen=True)
class Nothing:
    """The model says there is nothing more to do."""


MODEL = "model"
PROVIDER = "provider"


@dataclass(frozen=True)
class ContractError:
    """The output breaks the contract. `code` is stable; `excerpt` is the first 500
    characters of what the model wrote (diagnosis only). `source`: `model` when the
    model's output breaks the contract, `provider` when the surface's adapter refused
    the provider's response (its `AdapterErrorCode` is the code, whichever it is)."""

    code: str
    message: str
    excerpt: str
    source: str = MODEL

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "excerpt": self.excerpt, "source": self.source}


Parsed = ToolCalls | Final | Nothing | ContractError


def excerpt(text: str) -> str:
    return text[:EXCERPT_CHARS]


def _error(code: str, message: str, text: str) -> ContractError:
    return ContractError(code, message, excerpt(text))


def parse_json_contract(text: str) -> Parsed:
    """One model output in JSON mode. Whitespace and one Markdown code fence around
    the object are tolerated (models add them); anything else is the output."""
    body = _unfenced(text.strip())
    if not body:
        return _error("empty_output", "the model wrote nothing", text)
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        code = "truncated_output" if body.startswith("{") and not body.endswith("}") else "not_json"
        message = (
            "the output ends before its JSON object does" if code == "truncated_output"
            else "the output is not one JSON object"
        )
        return _error(code, message, text)
    if not isinstance(value, dict):
        return _error("not_an_object", "the output is JSON but not an object", text)
    return _from_object(value, text)


def _unfenced(body: str) -> str:
    if body.startswith("```") and body.endswith("```") and len(body) >= 6:
        inner = body[3:-3]
        first_newline = inner.find("\n")
        if first_newline >= 0 and inner[:first_newline].strip().isalpha():
            inner = inner[first_newline + 1:]
        return inner.strip()
    return body


def _from_object(value: Mapping[str, Any], text: str) -> Parsed:
    has_calls, has_final = "tool_calls" in value, "final" in value
    if has_calls and has_final:
        return _error("both_keys", "the object holds both tool_calls and final", text)
    if not has_calls and not has_final:
        if not value:
            return Nothing()  # `{}`
        return _error("neither_key", "the object holds neither tool_calls nor final", text)
    if set(value) - {"tool_calls", "final"}:
        return _error("unknown_keys", "the object has keys besides tool_calls or final", text)
    if has_final:
        final = value["final"]
        if final is None or final == "":
            return Nothing()
        if not isinstance(final, str):
            return _error("final_not_text", "final must be a string", text)
        return Final(final)
    calls = value["tool_calls"]
    if not isinstance(calls, list):
        return _error("tool_calls_not_a_list", "tool_calls must be a list", text)
    if not calls:
        return Nothing()
    proposals: list[ProposedCall] = []
    seen: set[str] = set()
    for index, call in enumerate(calls):
        if not isinstance(call, dict):
            return _error("bad_tool_call", f"tool call {index} is not an object", text)
        name = call.get("name")
        if not isinstance(name, str) or not name:
            return _error("bad_tool_call", f"tool call {index} has no name", text)
        call_id = call.get("id", f"call_{index + 1}")
        if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_CALL_ID_CHARS:
            return _error("bad_tool_call", f"tool call {index} has an unusable id", text)
        if call_id in seen:
            return _error("duplicate_call_id", "two tool calls share one id", text)
        seen.add(call_id)
        arguments = call.get("arguments", {})
        if isinstance(arguments, dict):
            arguments_text = json.dumps(arguments, separators=(",", ":"))
        elif isinstance(arguments, str):
            arguments_text = arguments  # the arguments gate parses (and refuses) it
        else:
            return _error("bad_tool_call", f"tool call {index} has arguments that are not an object", text)
        proposals.append(ProposedCall(call_id=call_id, tool_name=name, arguments=arguments_text))
    return ToolCalls(tuple(proposals))


def parse_native(
    response: Mapping[str, Any],
    read_proposals: Any,
    read_text: Any,
    known_names: Iterable[str],
) -> Parsed:
    """One provider response in native mode, through the surface's adapter.

    `read_proposals(response, known_names=...)` is the surface's reader (it raises
    `AdapterError`, `truncated_response` included, for a response it refuses);
    `read_text(response)` its final text."""
    from executor.providers.common import AdapterError

    try:
        proposals = read_proposals(response, known_names=known_names)
    except AdapterError as exc:
        return ContractError(
            str(exc.code), str(exc), excerpt(json.dumps(response, default=str)), source=PROVIDER
        )
    if proposals:
        return ToolCalls(tuple(proposals))
    text = read_text(response)
    return Final(text) if text else Nothing()


def proposals_to_json(proposals: Sequence[ProposedCall]) -> list[dict[str, Any]]:
    return [
        {"call_id": p.call_id, "tool_name": p.tool_name,
         "arguments": p.arguments if isinstance(p.arguments, str) else json.dumps(p.arguments)
         if isinstance(p.arguments, dict) else p.arguments.decode("utf-8", "replace")}
        for p in proposals
    ]


def proposals_from_json(data: Sequence[Mapping[str, Any]]) -> tuple[ProposedCall, ...]:
    return tuple(
        ProposedCall(call_id=d["call_id"], tool_name=d["tool_name"], arguments=d["arguments"]) for d in data
    )
