"""Hostile provider envelopes on all five surfaces: read_proposals → admit →
write_results and read_hosted_calls end in a value or an `AdapterError` the
surface's own checks chose (never the boundary's net: that is a crash here)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.providers import SURFACES, AdapterError, AdapterErrorCode
from executor.providers.common import decode_tool_name
from tests.fuzz import targets
from tests.fuzz.strategies import ENVELOPES, FUZZ, nested


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_fuzz_adapter__any_envelope__value_or_stable_adapter_error(surface: str) -> None:
    @FUZZ
    @given(envelope=ENVELOPES[surface])
    def run(envelope: Any) -> None:
        targets.adapter(surface, envelope)

    run()


# The crash sites the issue found, each pinned as it was reported.
REPORTED = [
    pytest.param("openai-responses", {"output": [{"type": {}}]}, id="responses_type_object"),
    pytest.param(
        "anthropic",
        {
            "stop_reason": [],
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
        },
        id="anthropic_stop_reason_list",
    ),
    pytest.param(
        "gemini",
        {"candidates": [{"finishReason": {}, "content": {"parts": []}}]},
        id="gemini_finish_reason_object",
    ),
    pytest.param(
        "gemini",
        {
            "candidates": [
                {
                    "content": {
                        "parts": [
                            {"functionCall": {"name": "get_\ud800weather", "args": {"city": "\udc80"}}}
                        ]
                    }
                }
            ]
        },
        id="gemini_no_id_lone_surrogate",
    ),
    pytest.param(
        "gemini",
        {
            "candidates": [
                {"content": {"parts": [{"functionCall": {"name": "get_weather", "args": nested(5_000)}}]}}
            ]
        },
        id="gemini_no_id_5000_deep",
    ),
    pytest.param(
        "openai-responses",
        {
            "status": "incomplete",
            "incomplete_details": {"reason": nested(5_000)},
            "output": [
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "x",
                    "arguments": "{}",
                    "status": "completed",
                }
            ],
        },
        id="responses_incomplete_reason_5000_deep",
    ),
    pytest.param(
        "openai-responses",
        {
            "output": [
                {
                    "type": "mcp_call",
                    "id": "m",
                    "arguments": nested(5_000),
                    "output": nested(5_000, "\ud800"),
                }
            ]
        },
        id="responses_hosted_5000_deep",
    ),
]


@pytest.mark.parametrize(("surface", "envelope"), REPORTED)
def test_fuzz_adapter__reported_crash_input__no_crash(surface: str, envelope: Any) -> None:
    targets.adapter(surface, envelope)


def test_adapter_boundary__unforeseen_error__adapter_error_naming_only_the_type() -> None:
    # Given an envelope whose reading raises an error the surface did not foresee
    class Hostile(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            raise KeyError(targets.CANARY)

    # Then the boundary answers a stable AdapterError that does not quote the error
    with pytest.raises(AdapterError) as raised:
        SURFACES["openai-chat"].read_proposals(Hostile())
    assert raised.value.code is AdapterErrorCode.MALFORMED_ENVELOPE
    assert raised.value.unexpected
    assert targets.CANARY not in str(raised.value)


@given(body=st.sampled_from(["_ed_a0_80", "_00", "_0a", "_1b", "_c0_80", "_ff"]))
def test_decode_tool_name__undecodable_or_control__left_as_written(body: str) -> None:
    # A model-written escaped name that decodes to a lone surrogate, NUL, a control
    # character or invalid UTF-8 names no tool: the gates see it as written
    wire = "tf--" + body
    for surface in SURFACES.values():
        assert decode_tool_name(wire, surface.name_rule) == wire
