"""How a turn ends when the provider's response is not a plain answer: a response the
adapter refuses, a paused response (Anthropic `pause_turn`, continued by the SDK
driver within the step budget), a step whose provider-run calls the hosted policy
refused or routed to approval. Pure parts and the SDK driver over a mock
transport; the worker's side is in tests/integration/test_turn_ends.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

try:  # the SDKs here ship on httpx2; elsewhere on httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

from executor.core.states import TurnState
from executor.errors import ConfigurationError
from executor.providers import SURFACES, encode_tool_name
from executor.providers.common import AdapterError, AdapterErrorCode
from executor.providers.hosted import NO_HOSTED_TOOLS, HostedPolicy, load_hosted_policy
from executor.turns import sdk
from executor.turns.contract import PROVIDER, ContractError, Final, ToolCalls, parse_native
from executor.turns.drivers import DriverError
from executor.turns.loop import HOSTED, End, next_action
from executor.turns.native import hosted_calls, parse_response
from executor.turns.values import EndReason, ModelRequest, StepOutcome, StepRecord, TurnOptions, Usage
from ledger.tools import registry


def step(outcome: StepOutcome, error: dict[str, Any] | None = None, final: str | None = None) -> StepRecord:
    return StepRecord(step=1, outcome=outcome, proposals=(), request_id="t.s1", usage=Usage("m", "turn"),
                      final_output=final, error=error)


# ------------------------------------------------------------------ the loop's ends


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        pytest.param(step(StepOutcome.CONTRACT_ERROR, {"code": "not_json", "source": "model"}),
                     End(TurnState.FALLBACK, EndReason.CONTRACT_ERROR), id="model_contract_error"),
        pytest.param(step(StepOutcome.CONTRACT_ERROR, {"code": "not_json"}),
                     End(TurnState.FALLBACK, EndReason.CONTRACT_ERROR), id="recorded_before_source"),
        pytest.param(step(StepOutcome.CONTRACT_ERROR, {"code": "truncated_response", "source": PROVIDER}),
                     End(TurnState.FALLBACK, EndReason.RESPONSE_REFUSED), id="adapter_refusal"),
        pytest.param(step(StepOutcome.CONTRACT_ERROR, {"code": "a_code_added_later", "source": PROVIDER}),
                     End(TurnState.FALLBACK, EndReason.RESPONSE_REFUSED), id="any_adapter_code"),
        pytest.param(step(StepOutcome.FINAL, {"code": "hosted_call_not_allowed", "source": HOSTED}, "Done"),
                     End(TurnState.FALLBACK, EndReason.HOSTED_CALL_NOT_ALLOWED), id="hosted_refused_final"),
        pytest.param(step(StepOutcome.TOOL_CALLS, {"code": "hosted_approval_required", "source": HOSTED}),
                     End(TurnState.FALLBACK, EndReason.HOSTED_APPROVAL_REQUIRED), id="hosted_approval"),
        pytest.param(step(StepOutcome.NOTHING, {"code": "unheard_of", "source": HOSTED}),
                     End(TurnState.FALLBACK, EndReason.HOSTED_CALL_NOT_ALLOWED), id="hosted_fails_closed"),
    ],
)
def test_next_action__provider_and_hosted_ends__each_with_its_reason(last: StepRecord, expected: End) -> None:
    assert next_action([last], None, TurnOptions()) == expected


def test_next_action__hosted_stop__ends_before_the_steps_calls_are_enqueued() -> None:
    from executor.core.types import ProposedCall

    calls = StepRecord(
        step=1, outcome=StepOutcome.TOOL_CALLS, request_id="t.s1", usage=Usage("m", "turn"),
        proposals=(ProposedCall(call_id="c1", tool_name="ledger.get_balance", arguments="{}"),),
        error={"code": "hosted_call_not_allowed", "source": HOSTED},
    )
    ended = End(TurnState.FALLBACK, EndReason.HOSTED_CALL_NOT_ALLOWED)
    assert next_action([calls], None, TurnOptions()) == ended


# ------------------------------------------------------------------ native responses


PAUSED: dict[str, Any] = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
    "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "rates"}},
        {"type": "text", "text": "Searching"},
    ],
    "stop_reason": "pause_turn", "stop_sequence": None, "usage": {"input_tokens": 40, "output_tokens": 5},
    "container": {"id": "container_1", "expires_at": "2026-12-04T20:00:00Z"},
}
FINISHED: dict[str, Any] = {
    "id": "msg_2", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "… the rate is 4%."}],
    "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 60, "output_tokens": 7},
}


def test_parse_response__paused_anthropic_response__is_refused_never_an_empty_answer() -> None:
    # An Anthropic response paused mid-turn holds no answer yet, even with text in it
    parsed = parse_response("anthropic", PAUSED, registry.names())
    assert isinstance(parsed, ContractError)
    assert (parsed.code, parsed.source) == ("pause_turn", PROVIDER)
    only_tools = {**PAUSED, "content": [PAUSED["content"][0]]}
    parsed = parse_response("anthropic", only_tools, registry.names())
    assert isinstance(parsed, ContractError) and parsed.code == "pause_turn"


def test_parse_native__any_adapter_refusal__is_a_provider_error_with_the_adapters_code() -> None:
    def refuse(response: Any, known_names: Any) -> list[Any]:
        raise AdapterError(AdapterErrorCode.MULTIPLE_CHOICES, "two choices", surface="openai-chat")

    parsed = parse_native({}, refuse, lambda r: "", [])
    assert isinstance(parsed, ContractError)
    assert parsed.to_json()["source"] == PROVIDER and parsed.code == "multiple_choices"


def test_hosted_calls__read_through_the_surface__or_its_refusal() -> None:
    [call] = hosted_calls("anthropic", PAUSED)  # type: ignore[misc]
    assert (call.kind, call.tool_name, call.item_id) == ("server_tool_use", "web_search", "srvtoolu_1")
    responses = {"output": [{"type": "mcp_call", "id": "mcp_1", "server_label": "crm", "name": "delete_all",
                             "arguments": "{}"}]}
    [mcp] = hosted_calls("openai-responses", responses)  # type: ignore[misc]
    assert (mcp.kind, mcp.server_label, mcp.tool_name) == ("mcp_call", "crm", "delete_all")
    refused = hosted_calls("openai-responses", {"output": "not a list"})
    assert isinstance(refused, ContractError) and refused.source == PROVIDER


# ------------------------------------------------------------------ the Anthropic driver continues


class Recorder:
    def __init__(self, *responses: dict[str, Any]) -> None:
        self.responses = list(responses)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content or b"{}"))
        if not self.responses:  # the provider fails the request (an overloaded API)
            return httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error"}})
        return httpx.Response(200, json=self.responses.pop(0))

    def client(self) -> Any:
        import anthropic

        return anthropic.Anthropic(
            api_key="test", http_client=httpx.Client(transport=httpx.MockTransport(self)), max_retries=0
        )


def request(max_continuations: int) -> ModelRequest:
    return ModelRequest(purpose="turn", prompt="What is the rate?", tools=(), turn_id="t", call_index=1,
                        max_continuations=max_continuations)


def test_anthropic_driver__pause_turn__sends_the_paused_content_back_and_answers_the_whole_turn() -> None:
    mock = Recorder(PAUSED, FINISHED)
    driver = sdk.build("anthropic", "claude", client=mock.client())
    response = driver.call(request(max_continuations=3))
    # Then the paused content went back as the assistant's turn, in the container it ran in
    assert len(mock.bodies) == 2
    first, second = mock.bodies
    assert first["messages"] == [{"role": "user", "content": "What is the rate?"}]
    assert second["messages"][0] == first["messages"][0]
    assert second["messages"][1]["role"] == "assistant"
    assert [b["type"] for b in second["messages"][1]["content"]] == ["server_tool_use", "text"]
    assert second["container"] == "container_1"
    # And the answer holds both rounds (the provider-run call included) and all their tokens
    assert response.raw is not None
    assert parse_response("anthropic", response.raw, registry.names()) == Final("Searching… the rate is 4%.")
    [call] = hosted_calls("anthropic", response.raw)  # type: ignore[misc]
    assert call.item_id == "srvtoolu_1"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (100, 12)


def test_anthropic_driver__still_paused_when_the_budget_is_spent__the_turn_is_told_so() -> None:
    mock = Recorder(PAUSED, PAUSED)
    driver = sdk.build("anthropic", "claude", client=mock.client())
    response = driver.call(request(max_continuations=1))
    assert len(mock.bodies) == 2  # one request, one continuation: no more
    assert response.raw is not None
    parsed = parse_response("anthropic", response.raw, registry.names())
    assert isinstance(parsed, ContractError) and parsed.code == "pause_turn"
    none_left = Recorder(PAUSED)
    response = sdk.build("anthropic", "claude", client=none_left.client()).call(request(max_continuations=0))
    assert len(none_left.bodies) == 1
    assert response.raw is not None and response.raw["stop_reason"] == "pause_turn"


def test_anthropic_json_driver__still_paused__is_a_driver_error_never_a_partial_answer() -> None:
    mock = Recorder(PAUSED, PAUSED)
    driver = sdk.build("anthropic+json", "claude", client=mock.client())
    with pytest.raises(DriverError) as paused:
        driver.call(request(max_continuations=1))
    # Not retryable: a retry would run the paused server tools again
    assert (paused.value.code, paused.value.retryable) == ("pause_turn", False)
    assert len(mock.bodies) == 2


def test_anthropic_driver__a_continuation_fails__the_rounds_that_ran_are_still_answered() -> None:
    # Given a paused first round (its server tool ran) and a continuation the API refuses
    mock = Recorder(PAUSED)
    driver = sdk.build("anthropic", "claude", client=mock.client())
    response = driver.call(request(max_continuations=3))
    # Then the first round is answered, still paused: its hosted call is there to be
    # recorded, and the turn ends pause_turn instead of losing it (or running it again)
    assert len(mock.bodies) == 2
    assert response.raw is not None and response.raw["stop_reason"] == "pause_turn"
    [call] = hosted_calls("anthropic", response.raw)  # type: ignore[misc]
    assert call.item_id == "srvtoolu_1"
    parsed = parse_response("anthropic", response.raw, registry.names())
    assert isinstance(parsed, ContractError) and parsed.code == "pause_turn"
    # A first request that fails is the driver's error, as before
    with pytest.raises(DriverError):
        sdk.build("anthropic", "claude", client=Recorder().client()).call(request(max_continuations=3))


def test_anthropic_driver__tool_call_response__is_not_continued() -> None:
    name = encode_tool_name("ledger.get_balance", SURFACES["anthropic"].name_rule)
    tool_use = {**FINISHED, "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": name, "input": {"account_id": "acme-1"}}]}
    mock = Recorder(tool_use)
    response = sdk.build("anthropic", "claude", client=mock.client()).call(request(max_continuations=5))
    assert len(mock.bodies) == 1 and response.raw is not None
    parsed = parse_response("anthropic", response.raw, registry.names())
    assert isinstance(parsed, ToolCalls) and parsed.proposals[0].tool_name == "ledger.get_balance"


# ------------------------------------------------------------------ the workers' hosted policy


HOSTED_POLICY = HostedPolicy(servers=(), builtin_tools=frozenset({"web_search"}))
NOT_A_POLICY = {"builtin_tools": ["web_search"]}


def test_load_hosted_policy__named_unset_or_broken() -> None:
    assert load_hosted_policy(None) is NO_HOSTED_TOOLS
    assert load_hosted_policy(f"{__name__}:HOSTED_POLICY") is HOSTED_POLICY
    # A policy that cannot be loaded is a configuration error, never an empty or open policy
    for spec in (f"{__name__}:NOT_A_POLICY", f"{__name__}:MISSING", "no_such_module_here:P", "no-colon"):
        with pytest.raises(ConfigurationError):
            load_hosted_policy(spec)
