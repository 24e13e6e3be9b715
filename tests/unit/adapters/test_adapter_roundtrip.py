"""Round trip on every surface: SDK-built response → proposals → results finished
in any order with any mix of failures → write-back → read back.

Property (I6, docs/design.md §Invariants): every proposal gets exactly one result, matched by its
call id (or, for a Gemini call the model gave no id, by position and name, as
the API matches it), never by the position the result arrived in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from adapter_testkit import (
    LONG_TOOL_NAME,
    Call,
    anthropic_response,
    gemini_response,
    interaction_response,
    make_registry,
    openai_chat_response,
    openai_responses_response,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.core.types import (
    ErrorCode,
    FailedRetryable,
    FailedTerminal,
    ProposedCall,
    Succeeded,
    ToolError,
)
from executor.providers import SURFACES, Surface
from executor.providers.common import (
    UNTRUSTED_NOTE,
    AdapterError,
    AdapterErrorCode,
    ToolResult,
    encode_tool_name,
)

REGISTRY = make_registry()
TOOL_NAMES = ["get_weather", "refund", "mcp.time/get", LONG_TOOL_NAME]


@dataclass(frozen=True)
class Spec:
    call_id: str | None
    tool_name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class WrittenResult:
    """One result as read back from a surface's write-back."""

    call_id: str | None
    wire_name: str | None
    payload: Any
    is_error: bool | None


def _text_args(spec: Spec) -> str:
    return json.dumps(spec.arguments)


@dataclass(frozen=True)
class Driver:
    build: Callable[[Sequence[Spec], Surface], dict[str, Any]]
    read_back: Callable[[list[dict[str, Any]]], list[WrittenResult]]
    optional_ids: bool = False


def _wire(spec: Spec, surface: Surface) -> str:
    return encode_tool_name(spec.tool_name, surface.name_rule)


def _calls(specs: Sequence[Spec], surface: Surface, *, as_text: bool) -> list[Call]:
    return [
        Call(s.call_id, _wire(s, surface), _text_args(s) if as_text else s.arguments)
        for s in specs
    ]


def _chat_back(messages: list[dict[str, Any]]) -> list[WrittenResult]:
    return [WrittenResult(m["tool_call_id"], None, json.loads(m["content"]), None) for m in messages]


def _responses_back(items: list[dict[str, Any]]) -> list[WrittenResult]:
    return [WrittenResult(i["call_id"], None, json.loads(i["output"]), None) for i in items]


def _anthropic_back(messages: list[dict[str, Any]]) -> list[WrittenResult]:
    assert len(messages) <= 1
    blocks = messages[0]["content"] if messages else []
    return [
        WrittenResult(b["tool_use_id"], None, json.loads(b["content"]), b["is_error"]) for b in blocks
    ]


def _gemini_back(contents: list[dict[str, Any]]) -> list[WrittenResult]:
    assert len(contents) <= 1
    parts = contents[0]["parts"] if contents else []
    written = []
    for part in parts:
        response = part["functionResponse"]
        body = response["response"]
        payload = body.get("output", body)
        written.append(
            WrittenResult(response.get("id"), response["name"], payload, "error" in body)
        )
    return written


def _interactions_back(steps: list[dict[str, Any]]) -> list[WrittenResult]:
    return [
        WrittenResult(s["call_id"], s["name"], json.loads(s["result"]), s["is_error"]) for s in steps
    ]


# With no calls each response is a plain final answer: a tool-call stop signal
# with no call is refused (tested per surface), not a round trip.
DRIVERS: dict[str, Driver] = {
    "openai-chat": Driver(
        lambda specs, s: openai_chat_response(
            _calls(specs, s, as_text=True), finish_reason="tool_calls" if specs else "stop"
        ),
        _chat_back,
    ),
    "openai-responses": Driver(
        lambda specs, s: openai_responses_response(_calls(specs, s, as_text=True)), _responses_back
    ),
    "anthropic": Driver(
        lambda specs, s: anthropic_response(
            _calls(specs, s, as_text=False), stop_reason="tool_use" if specs else "end_turn"
        ),
        _anthropic_back,
    ),
    "gemini": Driver(
        lambda specs, s: gemini_response(_calls(specs, s, as_text=False)),
        _gemini_back,
        optional_ids=True,
    ),
    "gemini-interactions": Driver(
        lambda specs, s: interaction_response(
            _calls(specs, s, as_text=False), status="requires_action" if specs else "completed"
        ),
        _interactions_back,
    ),
}


def test_drivers__cover_every_surface() -> None:
    assert set(DRIVERS) == set(SURFACES)


# ---------------------------------------------------------------- strategies

call_ids = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=24
).filter(lambda text: text.strip() != "")
arguments = st.dictionaries(
    st.text(max_size=8), st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=12), st.booleans()),
    max_size=3,
)
OUTCOMES = ["ok", "untrusted", "terminal", "retryable"]


@st.composite
def scenarios(draw: st.DrawFn, optional_ids: bool) -> tuple[list[Spec], list[str], list[int]]:
    count = draw(st.integers(min_value=0, max_value=20))
    ids = draw(st.lists(call_ids, min_size=count, max_size=count, unique=True))
    if optional_ids:
        ids = [None if draw(st.booleans()) else i for i in ids]  # type: ignore[misc]
    specs = [
        Spec(call_id, draw(st.sampled_from(TOOL_NAMES)), draw(arguments)) for call_id in ids
    ]
    outcomes = draw(st.lists(st.sampled_from(OUTCOMES), min_size=count, max_size=count))
    order = draw(st.permutations(range(count)))
    return specs, outcomes, order


def _result(call: ProposedCall, index: int, outcome: str) -> ToolResult:
    # Every payload names its own call, so a result written under another call shows.
    if outcome in ("ok", "untrusted"):
        return Succeeded(
            call_id=call.call_id, tool_name=call.tool_name,
            output={"for": index}, untrusted=outcome == "untrusted",
        )
    error = ToolError(code=ErrorCode.EXECUTION_FAILED, message=f"call {index} failed")
    failure = FailedTerminal if outcome == "terminal" else FailedRetryable
    return failure(call_id=call.call_id, tool_name=call.tool_name, error=error)


def _expected_payload(index: int, outcome: str) -> Any:
    if outcome == "ok":
        return {"for": index}
    if outcome == "untrusted":
        return {"note": UNTRUSTED_NOTE, "untrusted_data": {"for": index}}
    return {"error": {"code": "execution_failed", "message": f"call {index} failed", "details": []}}


# ---------------------------------------------------------------- properties

surfaces = pytest.mark.parametrize("surface_name", sorted(SURFACES))
property_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@surfaces
@property_settings
@given(data=st.data())
def test_roundtrip__any_completion_order_and_failure_mix__one_result_per_call_by_id(
    surface_name: str, data: st.DataObject
) -> None:
    surface, driver = SURFACES[surface_name], DRIVERS[surface_name]
    specs, outcomes, order = data.draw(scenarios(driver.optional_ids))

    proposals = surface.read_proposals(
        driver.build(specs, surface), known_names=REGISTRY.names()
    )

    assert [p.tool_name for p in proposals] == [s.tool_name for s in specs]
    for proposal, spec in zip(proposals, specs, strict=True):
        if spec.call_id is not None:
            assert proposal.call_id == spec.call_id
        parsed = json.loads(proposal.arguments) if isinstance(proposal.arguments, str) else proposal.arguments
        assert parsed == spec.arguments
    results = [_result(proposals[i], i, outcomes[i]) for i in order]

    written = driver.read_back(surface.write_results(proposals, results))

    assert len(written) == len(proposals)
    for index, (proposal, spec, back) in enumerate(zip(proposals, specs, written, strict=True)):
        assert back.call_id == spec.call_id  # the model's own id, or none when it gave none
        if back.wire_name is not None:
            assert back.wire_name == encode_tool_name(spec.tool_name, surface.name_rule)
        assert back.payload == _expected_payload(index, outcomes[index])
        if back.is_error is not None:
            assert back.is_error == (outcomes[index] in ("terminal", "retryable"))
        assert proposal.tool_name == spec.tool_name


@surfaces
@property_settings
@given(data=st.data())
def test_roundtrip__a_result_lost_or_doubled__refused(surface_name: str, data: st.DataObject) -> None:
    surface, driver = SURFACES[surface_name], DRIVERS[surface_name]
    specs, outcomes, order = data.draw(scenarios(driver.optional_ids))
    proposals = surface.read_proposals(driver.build(specs, surface), known_names=REGISTRY.names())
    if not proposals:
        return
    results = [_result(proposals[i], i, outcomes[i]) for i in order]
    victim = data.draw(st.integers(0, len(results) - 1))

    with pytest.raises(AdapterError) as lost:
        surface.write_results(proposals, results[:victim] + results[victim + 1 :])
    with pytest.raises(AdapterError) as doubled:
        surface.write_results(proposals, [*results, results[victim]])

    assert lost.value.code is AdapterErrorCode.MISSING_RESULT
    assert doubled.value.code is AdapterErrorCode.DUPLICATE_RESULT


# ---------------------------------------------------------------- outbound refusals, per surface


def _two_calls(surface_name: str) -> list[ProposedCall]:
    surface, driver = SURFACES[surface_name], DRIVERS[surface_name]
    specs = [Spec("id-1", "get_weather", {}), Spec("id-2", "refund", {})]
    return surface.read_proposals(driver.build(specs, surface))


def _ok(call: ProposedCall) -> Succeeded:
    return Succeeded(call_id=call.call_id, tool_name=call.tool_name)


@surfaces
@pytest.mark.parametrize(
    ("broken", "code"),
    [
        pytest.param(lambda c: [_ok(c[0])], AdapterErrorCode.MISSING_RESULT, id="missing"),
        pytest.param(
            lambda c: [_ok(c[0]), _ok(c[1]), Succeeded(call_id="id-9", tool_name="refund")],
            AdapterErrorCode.UNEXPECTED_RESULT, id="extra",
        ),
        pytest.param(
            lambda c: [_ok(c[0]), _ok(c[1]), _ok(c[1])], AdapterErrorCode.DUPLICATE_RESULT,
            id="duplicate",
        ),
        pytest.param(
            lambda c: [_ok(c[0]), Succeeded(call_id="id-2", tool_name="get_weather")],
            AdapterErrorCode.TOOL_NAME_MISMATCH, id="wrong-name",
        ),
    ],
)
def test_write__results_not_one_per_call__refused_with_own_code(
    surface_name: str,
    broken: Callable[[list[ProposedCall]], list[Any]],
    code: AdapterErrorCode,
) -> None:
    calls = _two_calls(surface_name)
    with pytest.raises(AdapterError) as excinfo:
        SURFACES[surface_name].write_results(calls, broken(calls))
    assert excinfo.value.code is code
    assert excinfo.value.surface == surface_name


@surfaces
def test_write__pending_result__refused_as_non_terminal(surface_name: str) -> None:
    from executor.core.types import Pending

    calls = _two_calls(surface_name)
    pending = Pending(
        call_id="id-2", tool_name="refund", operation_id="op-2", state="pending_approval"
    )
    with pytest.raises(AdapterError) as excinfo:
        SURFACES[surface_name].write_results(calls, [_ok(calls[0]), pending])
    assert excinfo.value.code is AdapterErrorCode.NON_TERMINAL_RESULT
