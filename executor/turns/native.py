"""Native tool calling (pure): a provider response read through toolfence's own
surface adapters (`executor.providers`), and the response's final text.

The proposals come from the surface's `read_proposals`, the same reader a
producer uses, so a turn admits exactly what `enqueue` would. The final text is
the response's text blocks, which the adapters do not read (they only read
calls); each surface's positions are spelt out here.

Whatever the adapter refuses (`truncated_response`, and any code it adds) is a
`ContractError` of source `provider`, its code the adapter's: the turn ends
`response_refused` with that code. So is a response the provider paused
(Anthropic `stop_reason: pause_turn`) that the driver did not continue: it is
unfinished, its text is not the answer. The calls the provider ran itself are
read by `hosted_calls`, for the worker to record under the application's
hosted policy, exactly as `enqueue(hosted=...)` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from executor.providers import SURFACES
from executor.providers.anthropic_messages import PAUSE_TURN, paused
from executor.providers.hosted import HostedCall
from executor.turns.contract import PROVIDER, ContractError, Parsed, excerpt, parse_native


def _joined(parts: Iterable[Any]) -> str:
    return "".join(p for p in parts if isinstance(p, str))


def _chat_text(response: Mapping[str, Any]) -> str:
    choices = response.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    content = (choices[0].get("message") or {}).get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return _joined(part.get("text") for part in content if isinstance(part, dict))
    return ""


def _responses_text(response: Mapping[str, Any]) -> str:
    texts: list[Any] = []
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            texts.extend(
                part.get("text") for part in item.get("content") or []
                if isinstance(part, dict) and part.get("type") == "output_text"
            )
    return _joined(texts)


def _anthropic_text(response: Mapping[str, Any]) -> str:
    return _joined(
        block.get("text") for block in response.get("content") or []
        if isinstance(block, dict) and block.get("type") == "text"
    )


def _gemini_text(response: Mapping[str, Any]) -> str:
    candidates = response.get("candidates") or []
    if not candidates or not isinstance(candidates[0], dict):
        return ""
    parts = (candidates[0].get("content") or {}).get("parts") or []
    return _joined(
        part.get("text") for part in parts if isinstance(part, dict) and not part.get("thought")
    )


def _interactions_text(response: Mapping[str, Any]) -> str:
    return _joined(
        item.get("text") for item in response.get("outputs") or []
        if isinstance(item, dict) and item.get("type") == "text"
    )


READ_TEXT: Mapping[str, Callable[[Mapping[str, Any]], str]] = {
    "openai-chat": _chat_text,
    "openai-responses": _responses_text,
    "anthropic": _anthropic_text,
    "gemini": _gemini_text,
    "gemini-interactions": _interactions_text,
}


def parse_response(surface: str, response: Mapping[str, Any], known_names: Iterable[str]) -> Parsed:
    """A native response: its calls through the surface's adapter, else its text."""
    parsed = parse_native(response, SURFACES[surface].read_proposals, READ_TEXT[surface], known_names)
    if isinstance(parsed, ContractError):
        return parsed
    if surface == "anthropic" and paused(response):
        return ContractError(
            PAUSE_TURN, "the provider paused the response and it was not continued",
            excerpt(json.dumps(response, default=str)), source=PROVIDER,
        )
    return parsed


def hosted_calls(surface: str, response: Mapping[str, Any]) -> list[HostedCall] | ContractError:
    """The calls the provider ran itself in this response, or the adapter's refusal."""
    from executor.providers.common import AdapterError

    try:
        return SURFACES[surface].read_hosted_calls(response)
    except AdapterError as exc:
        return ContractError(
            str(exc.code), str(exc), excerpt(json.dumps(response, default=str)), source=PROVIDER
        )
