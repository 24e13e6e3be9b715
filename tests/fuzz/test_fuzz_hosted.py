"""The hosted path on PostgreSQL: `read_hosted_calls` of each surface, then
`enqueue(hosted=…)` in the caller's own transaction after its own row, committed
after. Envelopes are mostly provider-run items (tests/fuzz/shapes.py) carrying ids
one past their columns, 5,000-deep arguments, lone surrogates, NUL and integers
beyond any float; the caller's row must survive each, and only `InvalidBatch` /
`InvalidIdentifier` may escape (tests/fuzz/targets.py::hosted_enqueue).

Each example commits on PostgreSQL: `TOOLFENCE_FUZZ_EXAMPLES // 10` examples per
surface (200 by default)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine

from executor.providers import SURFACES
from tests.fuzz import targets
from tests.fuzz.shapes import DEEP_TEXT, hosted_envelope
from tests.fuzz.strategies import SLOW_FUZZ, DataPicker


@pytest.fixture
def caller_db(pg_engine: Engine) -> Engine:
    targets.create_business_table(pg_engine)
    return pg_engine


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_fuzz_hosted_enqueue__any_envelope__caller_row_survives(surface: str, caller_db: Engine) -> None:
    @SLOW_FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        targets.hosted_enqueue(caller_db, surface, hosted_envelope(surface, DataPicker(data)))

    run()


def _approval_request(**fields: Any) -> dict[str, Any]:
    item = {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "server_label": "crm",
        "name": "update_customer",
        "arguments": '{"customer_id": "c-42"}',
    }
    return {"status": "completed", "output": [{**item, **fields}]}


# The hosted-path crashes issue #27 reported, each pinned as reported.
REPORTED = [
    pytest.param(_approval_request(id="i" * 201), id="approval_id_201_chars"),
    pytest.param(_approval_request(arguments=DEEP_TEXT), id="approval_arguments_5000_deep"),
    pytest.param(_approval_request(id="mcpr_\ud800"), id="approval_id_lone_surrogate"),
    # Found by the hosted fuzzer, beside the reported ones: PostgreSQL refuses NUL in text.
    pytest.param(_approval_request(id="id\x00"), id="approval_id_nul"),
    pytest.param(_approval_request(arguments='{"a": "\\ud800"}'), id="approval_arguments_lone_surrogate"),
    pytest.param(_approval_request(arguments='{"a": "\ud800"}'), id="approval_arguments_raw_lone_surrogate"),
    pytest.param(_approval_request(arguments={"a": "\ud800"}), id="approval_arguments_object_lone_surrogate"),
    pytest.param(
        {
            "output": [
                {
                    "type": "mcp_call",
                    "id": "m1",
                    "server_label": "crm",
                    "name": "update_customer",
                    "arguments": "{}",
                    "approval_request_id": "mcpr_\ud800",
                }
            ]
        },
        id="mcp_call_approval_request_id_lone_surrogate",
    ),
    # Found by the hosted fuzzer: the same look-up with NUL (DataError, the caller's row lost).
    pytest.param(
        {
            "output": [
                {
                    "type": "mcp_call",
                    "id": "m1",
                    "server_label": "crm",
                    "name": "update_customer",
                    "arguments": "{}",
                    "approval_request_id": "id\x00",
                }
            ]
        },
        id="mcp_call_approval_request_id_nul",
    ),
]


@pytest.mark.parametrize("envelope", REPORTED)
def test_hosted_enqueue__reported_crash_input__caller_row_survives(
    envelope: dict[str, Any], caller_db: Engine
) -> None:
    targets.hosted_enqueue(caller_db, "openai-responses", envelope)
