"""SDK drivers round-trip recorded responses through each SDK's own HTTP layer.

Each official SDK (openai, anthropic, google-genai) gets an HTTP client whose
transport is a `MockTransport` answering a recorded response: no network. The
driver's output goes through the surface's adapter (`parse_response`), as in a
turn: a recorded tool-call response becomes proposals with the registry's tool
name, a recorded final response the final text, and the usage record is read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

try:  # the SDKs here ship on httpx2; elsewhere on httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

from executor.core.types import ServerContext
from executor.providers import SURFACES, encode_tool_name
from executor.turns import sdk
from executor.turns.contract import Final, ToolCalls
from executor.turns.drivers import DriverError
from executor.turns.native import parse_response
from executor.turns.specs import load_driver
from executor.turns.values import ModelRequest
from ledger.tools import registry

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r")


def wire(surface: str) -> str:
    return encode_tool_name("ledger.get_balance", SURFACES[surface].name_rule)


class Recorder:
    """A mock transport answering `responses` in order, keeping every request body."""

    def __init__(self, *responses: dict[str, Any]) -> None:
        self.responses = list(responses)
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content or b"{}"))
        self.paths.append(request.url.path)
        return httpx.Response(200, json=self.responses.pop(0))

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self))


def request_for(surface: str) -> ModelRequest:
    return ModelRequest(
        purpose="turn", prompt="What is the balance of acme-1?", tools=(), turn_id="turn_1", call_index=1,
        native_tools=tuple(SURFACES[surface].export_tools(registry, ALICE)),
    )


def chat(mock: Recorder) -> Any:
    import openai

    return openai.OpenAI(api_key="test", http_client=mock.client(), max_retries=0)


def anthropic_client(mock: Recorder) -> Any:
    import anthropic

    return anthropic.Anthropic(api_key="test", http_client=mock.client(), max_retries=0)


def gemini_client(mock: Recorder) -> Any:
    from google import genai
    from google.genai import types

    return genai.Client(api_key="test", http_options=types.HttpOptions(httpx_client=mock.client()))


ARGS = {"account_id": "acme-1"}

RECORDED: dict[str, tuple[Callable[[Recorder], Any], dict[str, Any], dict[str, Any]]] = {
    "openai-chat": (
        chat,
        {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
             "role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": wire("openai-chat"), "arguments": json.dumps(ARGS)}}]}}],
         "usage": {"prompt_tokens": 51, "completion_tokens": 9, "total_tokens": 60}},
        {"id": "chatcmpl-2", "object": "chat.completion", "created": 2, "model": "gpt-4o-mini",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "The balance is 100,000.00."}}],
         "usage": {"prompt_tokens": 80, "completion_tokens": 8, "total_tokens": 88}},
    ),
    "openai-responses": (
        chat,
        {"id": "resp_1", "object": "response", "created_at": 1, "model": "gpt-4o-mini", "status": "completed",
         "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1",
                     "name": wire("openai-responses"), "arguments": json.dumps(ARGS), "status": "completed"}],
         "usage": {"input_tokens": 51, "output_tokens": 9, "total_tokens": 60}},
        {"id": "resp_2", "object": "response", "created_at": 2, "model": "gpt-4o-mini", "status": "completed",
         "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                     "content": [{"type": "output_text", "text": "The balance is 100,000.00.",
                                  "annotations": []}]}],
         "usage": {"input_tokens": 80, "output_tokens": 8, "total_tokens": 88}},
    ),
    "anthropic": (
        anthropic_client,
        {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
         "content": [{"type": "tool_use", "id": "toolu_1", "name": wire("anthropic"), "input": ARGS}],
         "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 51, "output_tokens": 9}},
        {"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
         "content": [{"type": "text", "text": "The balance is 100,000.00."}],
         "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 80, "output_tokens": 8}},
    ),
    "gemini": (
        gemini_client,
        {"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": wire("gemini"), "args": ARGS}}]}, "finishReason": "STOP", "index": 0}],
         "usageMetadata": {"promptTokenCount": 51, "candidatesTokenCount": 9, "totalTokenCount": 60},
         "modelVersion": "gemini-2.5-flash"},
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "The balance is 100,000.00."}]},
                         "finishReason": "STOP", "index": 0}],
         "usageMetadata": {"promptTokenCount": 80, "candidatesTokenCount": 8, "totalTokenCount": 88},
         "modelVersion": "gemini-2.5-flash"},
    ),
}


@pytest.mark.parametrize("surface", sorted(RECORDED))
def test_sdk_driver__recorded_tool_call_then_final__round_trip_through_the_sdk(surface: str) -> None:
    make_client, tool_call, final = RECORDED[surface]
    # Given the SDK driver of the surface, on an SDK client whose transport answers recordings
    mock = Recorder(tool_call, final)
    driver = sdk.build(surface, "some-model", client=make_client(mock))
    # When a turn asks it twice (a tool call, then the final answer)
    first = driver.call(request_for(surface))
    second = driver.call(request_for(surface))
    # Then the adapter reads the first as a proposal of the registry's tool, the second as text
    calls = parse_response(surface, first.raw or {}, registry.names())
    assert isinstance(calls, ToolCalls)
    [proposal] = calls.proposals
    assert proposal.tool_name == "ledger.get_balance"
    arguments = proposal.arguments if isinstance(proposal.arguments, str) else json.dumps(proposal.arguments)
    assert json.loads(arguments) == ARGS
    assert parse_response(surface, second.raw or {}, registry.names()) == Final("The balance is 100,000.00.")
    # And the usage record came from the response
    assert (first.usage.input_tokens, first.usage.output_tokens) == (51, 9)
    assert (second.usage.purpose, second.usage.input_tokens) == ("turn", 80)
    # And the request carried the prompt and the surface's own tool declarations, nothing else to run
    body = json.dumps(mock.bodies[0])
    assert "What is the balance of acme-1?" in body and wire(surface) in body
    assert len(mock.bodies) == 2


def test_sdk_driver__json_variant__sends_no_tools_and_returns_the_text() -> None:
    mock = Recorder(RECORDED["anthropic"][2] | {
        "content": [{"type": "text", "text": '{"final": "done"}'}],
    })
    driver = sdk.build("anthropic+json", "claude", client=anthropic_client(mock))
    response = driver.call(request_for("anthropic"))
    assert response.text == '{"final": "done"}' and response.raw is None
    assert "tools" not in mock.bodies[0]


def test_sdk_driver__provider_error__is_a_driver_error_without_the_sdk_message() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "overloaded; your prompt was: secret"}})

    import openai

    client = openai.OpenAI(api_key="test", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(refuse)))
    driver = sdk.build("openai-chat", "gpt", client=client)
    with pytest.raises(DriverError) as failed:
        driver.call(request_for("openai-chat"))
    assert failed.value.retryable and "secret" not in str(failed.value)


def test_load_driver__sdk_kinds__build_lazily_without_a_client() -> None:
    for spec, mode in [("openai-chat:m", "openai-chat"), ("openai-responses:m", "openai-responses"),
                       ("anthropic:m", "anthropic"), ("gemini:m", "gemini"), ("gemini+json:m", "json")]:
        driver = load_driver(spec)
        assert driver.mode == mode
        assert driver.client is None  # type: ignore[attr-defined]
