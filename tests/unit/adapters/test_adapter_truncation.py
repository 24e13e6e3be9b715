"""Every surface refuses a response the provider says is not whole, before admission.

A cut-off response's last call may hold arguments that still parse and
validate (a refund without its closing fields, an object missing the key the
model had not written yet), and the calls before it are a plan the model did
not finish. So each truncation signal refuses the envelope with
`truncated_response`, naming the cut call when the envelope shows which one.
Responses are built with each SDK's own types.
"""

from __future__ import annotations

from typing import Any

import pytest
from adapter_testkit import (
    Call,
    anthropic_response,
    gemini_response,
    interaction_response,
    openai_chat_response,
    openai_responses_response,
)
from google.genai import types as genai_types
from openai.types.responses import Response

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

# `reason` has a default, so this cut refund would pass the schema gate as it stands.
REFUND_SO_FAR = {"order_id": "o-1", "amount_cents": 100}


def _truncation(read: Any, response: Any) -> AdapterError:
    with pytest.raises(AdapterError) as excinfo:
        read(response)
    assert excinfo.value.code is AdapterErrorCode.TRUNCATED_RESPONSE
    return excinfo.value


def test_truncated_response__one_stable_code_shared_with_results() -> None:
    assert AdapterErrorCode.TRUNCATED_RESPONSE.value == ErrorCode.TRUNCATED_RESPONSE.value


# ---------------------------------------------------------------- OpenAI Chat Completions


def test_chat__finish_reason_length__refused_naming_the_last_call() -> None:
    # Given a choice cut off by max_tokens whose last arguments happen to parse
    response = openai_chat_response(
        [Call("call_1", "get_weather", '{"city":"Oslo"}'),
         Call("call_2", "refund", '{"order_id":"o-1","amount_cents":100}')],
        finish_reason="length",
    )
    # When read / Then refused, naming the call being written when the limit hit
    error = _truncation(openai_chat.read_proposals, response)
    assert error.call_id == "call_2" and error.surface == "openai-chat"


def test_chat__finish_reason_length_without_calls__refused_not_read_as_no_calls() -> None:
    # A cut answer is not the model's finished turn, even with no call in it.
    response = openai_chat_response([], finish_reason="length", content="The weather in Os")
    assert _truncation(openai_chat.read_proposals, response).call_id is None


# ---------------------------------------------------------------- OpenAI Responses


def _responses(status: str, item_status: str = "completed") -> dict[str, Any]:
    response = openai_responses_response(
        [Call("call_1", "get_weather", '{"city":"Oslo"}'), Call("call_2", "refund", "{}")]
    )
    response["status"] = status
    if status == "incomplete":
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    response["output"][-1]["status"] = item_status
    return Response.model_validate(response).to_dict()


@pytest.mark.parametrize("item_status", ["incomplete", "in_progress"])
def test_responses__call_item_not_completed__refused_naming_that_call(item_status: str) -> None:
    error = _truncation(openai_responses.read_proposals, _responses("completed", item_status))
    assert error.call_id == "call_2"


def test_responses__response_incomplete__refused_though_every_item_completed() -> None:
    error = _truncation(openai_responses.read_proposals, _responses("incomplete"))
    assert error.call_id is None  # no item says which call was cut


def test_responses__incomplete_item_in_incomplete_response__that_item_named() -> None:
    error = _truncation(openai_responses.read_proposals, _responses("incomplete", "incomplete"))
    assert error.call_id == "call_2"


# ---------------------------------------------------------------- Anthropic Messages


@pytest.mark.parametrize("stop_reason", ["max_tokens", "model_context_window_exceeded"])
def test_anthropic__cut_while_writing_tool_use__refused_naming_it(stop_reason: str) -> None:
    response = anthropic_response(
        [Call("toolu_1", "get_weather", {"city": "Oslo"}), Call("toolu_2", "refund", REFUND_SO_FAR)],
        stop_reason=stop_reason,
    )
    error = _truncation(anthropic_messages.read_proposals, response)
    assert error.call_id == "toolu_2"


def test_anthropic__cut_in_text_after_the_calls__refused_naming_none() -> None:
    response = anthropic_response(
        [Call("toolu_1", "get_weather", {"city": "Oslo"})], stop_reason="max_tokens"
    )
    response["content"].append({"type": "text", "text": "Next I will ref", "citations": None})
    error = _truncation(anthropic_messages.read_proposals, response)
    assert error.call_id is None


# ---------------------------------------------------------------- Gemini GenerateContent


def _gemini_with(function_call: dict[str, Any], spelling: str) -> dict[str, Any]:
    response = genai_types.GenerateContentResponse.model_validate(
        {"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"id": "fc-1", "name": "get_weather", "args": {"city": "Oslo"}}},
            {"functionCall": function_call},
        ]}, "finishReason": "STOP"}]}
    )
    return response.model_dump(mode="json", exclude_none=True, by_alias=spelling == "camel")


@pytest.mark.parametrize("spelling", ["camel", "snake"])
@pytest.mark.parametrize(
    "signal",
    [
        pytest.param({"willContinue": True}, id="will-continue"),
        pytest.param(
            {"partialArgs": [{"jsonPath": "$.order_id", "stringValue": "o-", "willContinue": True}]},
            id="partial-args",
        ),
    ],
)
def test_gemini__function_call_not_whole__refused_naming_it(
    signal: dict[str, Any], spelling: str
) -> None:
    response = _gemini_with({"id": "fc-2", "name": "refund", "args": REFUND_SO_FAR, **signal}, spelling)
    error = _truncation(gemini_generate.read_proposals, response)
    assert error.call_id == "fc-2"


def test_gemini__will_continue_false_and_no_partial_args__read() -> None:
    response = _gemini_with(
        {"id": "fc-2", "name": "refund", "args": REFUND_SO_FAR, "willContinue": False}, "camel"
    )
    assert [p.call_id for p in gemini_generate.read_proposals(response)] == ["fc-1", "fc-2"]


def test_gemini__finish_max_tokens_with_calls__refused_naming_the_last() -> None:
    response = gemini_response(
        [Call("fc-1", "get_weather", {"city": "Oslo"}), Call("fc-2", "refund", REFUND_SO_FAR)],
        finish_reason="MAX_TOKENS",
    )
    error = _truncation(gemini_generate.read_proposals, response)
    assert error.call_id == "fc-2"


def test_gemini__finish_max_tokens_without_calls__refused_not_read_as_no_calls() -> None:
    _truncation(gemini_generate.read_proposals, gemini_response([], finish_reason="MAX_TOKENS"))


# ---------------------------------------------------------------- Gemini Interactions


def test_interactions__incomplete_with_unanswered_calls__refused() -> None:
    response = interaction_response([Call("c1", "refund", REFUND_SO_FAR)], status="incomplete")
    error = _truncation(gemini_interactions.read_proposals, response)
    assert error.call_id == "c1"


# ---------------------------------------------------------------- every surface


def test_every_surface__complete_response__not_refused_as_truncated() -> None:
    # The signals above are the only ones: a whole response reads as before.
    whole = {
        "openai-chat": openai_chat_response([Call("c1", "get_weather", "{}")]),
        "openai-responses": openai_responses_response([Call("c1", "get_weather", "{}")]),
        "anthropic": anthropic_response([Call("c1", "get_weather", {})]),
        "gemini": gemini_response([Call("c1", "get_weather", {})]),
        "gemini-interactions": interaction_response([Call("c1", "get_weather", {})]),
    }
    assert set(whole) == set(SURFACES)
    for name, response in whole.items():
        assert [p.call_id for p in SURFACES[name].read_proposals(response)] == ["c1"]
