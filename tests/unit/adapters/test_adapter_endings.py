"""A response that did not finish is refused whatever it holds (decision 0196).

Before, a cut-off, filtered or failed response holding only text read as "no
calls" (`[]`), the same as a finished answer, so a producer reading the adapter
directly could not tell them apart. Each surface classifies every end value its
SDK defines (`ENDINGS`); the tests read those values from the installed SDKs,
so a value a new SDK adds fails here until it is classified.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from adapter_testkit import (
    Call,
    anthropic_response,
    gemini_response,
    interaction_response,
    openai_chat_response,
    openai_responses_response,
    sdk_literals,
)
from anthropic.types import StopReason
from google.genai import interactions as genai_interactions
from google.genai import types as genai_types
from openai.types.chat.chat_completion import Choice
from openai.types.responses import Response
from openai.types.responses.response import IncompleteDetails

from executor.core.types import ErrorCode
from executor.providers import (
    SURFACES,
    anthropic_messages,
    gemini_generate,
    gemini_interactions,
    openai_chat,
    openai_responses,
)
from executor.providers.common import AdapterError, AdapterErrorCode
from executor.providers.endings import Ending, Endings
from executor.turns.contract import ContractError
from executor.turns.native import parse_response

SDK_ENDS: dict[str, tuple[Endings, set[str]]] = {
    "openai-chat": (openai_chat.ENDINGS, sdk_literals(Choice.model_fields["finish_reason"].annotation)),
    "openai-responses": (openai_responses.ENDINGS, sdk_literals(Response.model_fields["status"].annotation)),
    "anthropic": (anthropic_messages.ENDINGS, sdk_literals(StopReason)),
    "gemini": (gemini_generate.ENDINGS, {reason.value for reason in genai_types.FinishReason}),
    "gemini-interactions": (gemini_interactions.ENDINGS, sdk_literals(genai_interactions.InteractionStatus)),
}


def test_sdk_ends__cover_every_surface() -> None:
    assert set(SDK_ENDS) == set(SURFACES)


@pytest.mark.parametrize("surface_name", sorted(SDK_ENDS))
def test_every_sdk_end_value__classified_explicitly(surface_name: str) -> None:
    endings, sdk_values = SDK_ENDS[surface_name]
    assert len(sdk_values) >= 4, "the SDK's end values were not found"
    # Given every end value the installed SDK defines
    # Then each is named in exactly one class (unknown ones would be refused unfinished)
    assert sdk_values - endings.named() == set()


def test_responses_incomplete_reasons__every_sdk_reason_refused() -> None:
    reasons = sdk_literals(IncompleteDetails.model_fields["reason"].annotation)
    assert "content_filter" in reasons
    for reason in reasons:
        response = _responses_text_only("incomplete", reason)
        with pytest.raises(AdapterError) as excinfo:
            openai_responses.read_proposals(response)
        expected = "filtered_response" if reason == "content_filter" else "truncated_response"
        assert excinfo.value.code.value == expected, reason


def test_new_codes__shared_with_error_codes() -> None:
    assert AdapterErrorCode.FILTERED_RESPONSE.value == ErrorCode.FILTERED_RESPONSE.value
    assert AdapterErrorCode.UNFINISHED_RESPONSE.value == ErrorCode.UNFINISHED_RESPONSE.value


# ---------------------------------------------------------------- text-only responses


def _responses_text_only(status: str, reason: str | None = None) -> dict[str, Any]:
    response: dict[str, Any] = openai_responses_response([])
    response["status"] = status
    if reason is not None:
        response["incomplete_details"] = {"reason": reason}
    return response


def _gemini_text_only(finish: str) -> dict[str, Any]:
    response: dict[str, Any] = gemini_response([], finish_reason=finish)
    return response


def _interaction_text_only(status: str) -> dict[str, Any]:
    response: dict[str, Any] = interaction_response([], status=status)
    response["steps"].append({"type": "model_output", "content": [{"type": "text", "text": "Partly"}]})
    return response


# (surface, the envelope's end, a text-only response with that end, the code)
TEXT_ONLY: list[tuple[str, str, Callable[[], dict[str, Any]], AdapterErrorCode]] = [
    ("openai-chat", "length", lambda: openai_chat_response([], finish_reason="length", content="The wea"),
     AdapterErrorCode.TRUNCATED_RESPONSE),
    ("openai-chat", "content_filter",
     lambda: openai_chat_response([], finish_reason="content_filter", content="Here is"),
     AdapterErrorCode.FILTERED_RESPONSE),
    ("openai-responses", "incomplete", lambda: _responses_text_only("incomplete", "max_output_tokens"),
     AdapterErrorCode.TRUNCATED_RESPONSE),
    ("openai-responses", "failed", lambda: _responses_text_only("failed"),
     AdapterErrorCode.UNFINISHED_RESPONSE),
    ("openai-responses", "in_progress", lambda: _responses_text_only("in_progress"),
     AdapterErrorCode.UNFINISHED_RESPONSE),
    ("openai-responses", "cancelled", lambda: _responses_text_only("cancelled"),
     AdapterErrorCode.UNFINISHED_RESPONSE),
    ("anthropic", "max_tokens", lambda: anthropic_response([], stop_reason="max_tokens", text="The wea"),
     AdapterErrorCode.TRUNCATED_RESPONSE),
    ("anthropic", "model_context_window_exceeded",
     lambda: anthropic_response([], stop_reason="model_context_window_exceeded", text="The"),
     AdapterErrorCode.TRUNCATED_RESPONSE),
    ("anthropic", "refusal", lambda: anthropic_response([], stop_reason="refusal", text="I"),
     AdapterErrorCode.FILTERED_RESPONSE),
    ("gemini", "MAX_TOKENS", lambda: _gemini_text_only("MAX_TOKENS"), AdapterErrorCode.TRUNCATED_RESPONSE),
    ("gemini", "SAFETY", lambda: _gemini_text_only("SAFETY"), AdapterErrorCode.FILTERED_RESPONSE),
    ("gemini", "RECITATION", lambda: _gemini_text_only("RECITATION"), AdapterErrorCode.FILTERED_RESPONSE),
    ("gemini", "OTHER", lambda: _gemini_text_only("OTHER"), AdapterErrorCode.UNFINISHED_RESPONSE),
    ("gemini-interactions", "incomplete", lambda: _interaction_text_only("incomplete"),
     AdapterErrorCode.TRUNCATED_RESPONSE),
    ("gemini-interactions", "failed", lambda: _interaction_text_only("failed"),
     AdapterErrorCode.UNFINISHED_RESPONSE),
    ("gemini-interactions", "in_progress", lambda: _interaction_text_only("in_progress"),
     AdapterErrorCode.UNFINISHED_RESPONSE),
]


def test_text_only_cases__cover_every_surface() -> None:
    assert {surface for surface, *_ in TEXT_ONLY} == set(SURFACES)


@pytest.mark.parametrize(
    ("surface_name", "end", "build", "code"), TEXT_ONLY, ids=[f"{s}-{e}" for s, e, *_ in TEXT_ONLY]
)
def test_text_only_response__not_finished__refused_never_no_calls(
    surface_name: str, end: str, build: Callable[[], dict[str, Any]], code: AdapterErrorCode
) -> None:
    # Given a response holding only text, whose end says it did not finish
    response = build()
    # When a producer reads it
    with pytest.raises(AdapterError) as excinfo:
        SURFACES[surface_name].read_proposals(response)
    # Then it is refused with the end's stable code, not read as "no calls"
    assert excinfo.value.code is code
    assert excinfo.value.unexpected is False


@pytest.mark.parametrize(
    ("surface_name", "end", "build", "code"), TEXT_ONLY, ids=[f"{s}-{e}" for s, e, *_ in TEXT_ONLY]
)
def test_native_turn_step__not_finished__contract_error_with_the_code(
    surface_name: str, end: str, build: Callable[[], dict[str, Any]], code: AdapterErrorCode
) -> None:
    # A native turn's step ends the turn with a stated reason (contract_error and
    # this code in the step), never as a final answer of the partial text.
    parsed = parse_response(surface_name, build(), ())
    assert isinstance(parsed, ContractError) and parsed.code == code.value


UNKNOWN_ENDS: dict[str, Callable[[str], dict[str, Any]]] = {
    "openai-chat": lambda end: {
        **openai_chat_response([]),
        "choices": [{"index": 0, "finish_reason": end, "message": {"role": "assistant", "content": "Hi"}}],
    },
    "openai-responses": lambda end: _responses_text_only(end),
    "anthropic": lambda end: {**anthropic_response([], stop_reason="end_turn"), "stop_reason": end},
    "gemini": lambda end: {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}]}, "finishReason": end}]
    },
    "gemini-interactions": lambda end: {**_interaction_text_only("completed"), "status": end},
}


@pytest.mark.parametrize("surface_name", sorted(UNKNOWN_ENDS))
def test_unknown_end_value__refused_unfinished(surface_name: str) -> None:
    assert set(UNKNOWN_ENDS) == set(SURFACES)
    with pytest.raises(AdapterError) as excinfo:
        SURFACES[surface_name].read_proposals(UNKNOWN_ENDS[surface_name]("ended_some_new_way"))
    assert excinfo.value.code is AdapterErrorCode.UNFINISHED_RESPONSE
    assert "does not know" in excinfo.value.message


@pytest.mark.parametrize("surface_name", sorted(UNKNOWN_ENDS))
def test_finished_text_only_response__no_calls(surface_name: str) -> None:
    finished = {
        "openai-chat": "stop", "openai-responses": "completed", "anthropic": "end_turn",
        "gemini": "STOP", "gemini-interactions": "completed",
    }[surface_name]
    assert SURFACES[surface_name].read_proposals(UNKNOWN_ENDS[surface_name](finished)) == []


def test_chat__model_refusal__refused_as_filtered() -> None:
    response = openai_chat_response([], finish_reason="stop")
    response["choices"][0]["message"]["refusal"] = "I can't help with that."
    with pytest.raises(AdapterError) as excinfo:
        openai_chat.read_proposals(response)
    assert excinfo.value.code is AdapterErrorCode.FILTERED_RESPONSE


def test_chat__every_message_field__known() -> None:
    from openai.types.chat import ChatCompletionMessage

    assert set(ChatCompletionMessage.model_fields) - openai_chat.MESSAGE_FIELDS == set()


def test_responses__filtered_with_calls__refused_as_filtered() -> None:
    response = openai_responses_response([Call("call_1", "get_weather", '{"city":"Oslo"}')])
    response["status"] = "incomplete"
    response["incomplete_details"] = {"reason": "content_filter"}
    with pytest.raises(AdapterError) as excinfo:
        openai_responses.read_proposals(response)
    assert excinfo.value.code is AdapterErrorCode.FILTERED_RESPONSE


def test_cut_response__its_last_call_malformed__refused_as_cut_not_as_malformed() -> None:
    # A response cut mid-call may end with a call that does not parse: the end is
    # read first, so the refusal says it was cut (what happened), not malformed
    anthropic = anthropic_response(
        [Call("toolu_1", "get_weather", {"city": "Oslo"})], stop_reason="max_tokens"
    )
    anthropic["content"][-1]["input"] = "not an object"
    responses = openai_responses_response([Call("call_1", "get_weather", '{"city":"Oslo"}')])
    responses["status"] = "incomplete"
    responses["incomplete_details"] = {"reason": "max_output_tokens"}
    del responses["output"][-1]["call_id"]
    for read, response in ((anthropic_messages.read_proposals, anthropic),
                           (openai_responses.read_proposals, responses)):
        with pytest.raises(AdapterError) as excinfo:
            read(response)
        assert excinfo.value.code is AdapterErrorCode.TRUNCATED_RESPONSE, excinfo.value


# ---------------------------------------------------------------- Anthropic pause_turn


def test_anthropic__pause_turn__not_refused_and_detectable() -> None:
    # Given a message the server paused mid-turn (a long server-tool run)
    response = anthropic_response([], stop_reason="pause_turn", text="Searching")
    response["content"].append(
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}}
    )
    # Then it is read as usual, and the caller can tell it must continue the turn
    assert anthropic_messages.read_proposals(response) == []
    assert anthropic_messages.paused(response) is True
    assert anthropic_messages.ENDINGS.classify("pause_turn") is Ending.PAUSED
    assert [c.kind for c in anthropic_messages.read_hosted_calls(response)] == ["server_tool_use"]


def test_anthropic__paused__false_for_every_other_end() -> None:
    for end in sdk_literals(StopReason) - {"pause_turn"}:
        assert anthropic_messages.paused({"stop_reason": end, "content": []}) is False
    assert anthropic_messages.paused({"content": []}) is False
