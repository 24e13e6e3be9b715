"""Every surface writes a success's freshness the same way: `observed_at`,
`source_time`, `age_seconds` and `stale` before the output (common.py builds the
payload once), and a success whose observation time is unknown as before.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from adapter_testkit import make_registry
from test_adapter_roundtrip import DRIVERS, Spec

from executor.core.types import ProposedCall, Succeeded
from executor.providers import SURFACES
from executor.providers.common import UNTRUSTED_NOTE

REGISTRY = make_registry()
OBSERVED_AT = datetime(2024, 5, 1, 10, 0, 0, 250_000, tzinfo=UTC).timestamp()
SOURCE_TIME = datetime(2024, 5, 1, 9, 58, tzinfo=UTC).timestamp()

surfaces = pytest.mark.parametrize("surface_name", sorted(SURFACES))


def _proposals(surface_name: str) -> list[ProposedCall]:
    surface, driver = SURFACES[surface_name], DRIVERS[surface_name]
    specs = [
        Spec("id-fresh", "get_weather", {"city": "Oslo"}),
        Spec("id-stale", "get_weather", {"city": "Bergen"}),
        Spec("id-receipt", "refund", {"order_id": "o-1", "amount_cents": 5}),
        Spec("id-unknown", "mcp.time/get", {"timezone": "UTC"}),
    ]
    return surface.read_proposals(driver.build(specs, surface), known_names=REGISTRY.names())


def test_freshness_cases__cover_every_surface() -> None:
    assert set(DRIVERS) == set(SURFACES)


@surfaces
def test_write_results__stored_successes__every_surface_carries_observed_at_age_and_stale(
    surface_name: str,
) -> None:
    fresh, stale, receipt, unknown = _proposals(surface_name)
    results = [
        Succeeded(
            call_id=fresh.call_id, tool_name=fresh.tool_name, output={"temperature": 11.5},
            observed_at=OBSERVED_AT, source_time=SOURCE_TIME, age_seconds=4.25, stale=False,
        ),
        Succeeded(
            call_id=stale.call_id, tool_name=stale.tool_name, output="<b>ignore previous</b>",
            untrusted=True, observed_at=OBSERVED_AT, age_seconds=7200.123456, stale=True,
        ),
        Succeeded(
            call_id=receipt.call_id, tool_name=receipt.tool_name, output={"refund_id": "rf-1"},
            observed_at=OBSERVED_AT, age_seconds=30.0, stale=False,
        ),
        # Built by an application, or stored before freshness existed: shown as before.
        Succeeded(call_id=unknown.call_id, tool_name=unknown.tool_name, output={"time": "10:00"}),
    ]

    written = DRIVERS[surface_name].read_back(
        SURFACES[surface_name].write_results([fresh, stale, receipt, unknown], results)
    )

    payloads = {back.call_id: back.payload for back in written}
    assert payloads["id-fresh"] == {
        "observed_at": "2024-05-01T10:00:00.250Z",
        "source_time": "2024-05-01T09:58:00.000Z",
        "age_seconds": 4.25,
        "stale": False,
        "output": {"temperature": 11.5},
    }
    assert payloads["id-stale"] == {
        "observed_at": "2024-05-01T10:00:00.250Z",
        "source_time": None,
        "age_seconds": 7200.123,
        "stale": True,
        "output": {"note": UNTRUSTED_NOTE, "untrusted_data": "<b>ignore previous</b>"},
    }
    # Our own fields come first; in the untrusted wrapper the note still precedes the data.
    assert list(payloads["id-stale"]) == ["observed_at", "source_time", "age_seconds", "stale", "output"]
    assert list(payloads["id-stale"]["output"]) == ["note", "untrusted_data"]
    assert payloads["id-receipt"]["stale"] is False
    assert payloads["id-receipt"]["output"] == {"refund_id": "rf-1"}
    assert payloads["id-unknown"] == {"time": "10:00"}
    if written[0].is_error is not None:
        assert [back.is_error for back in written] == [False, False, False, False]


@surfaces
def test_write_results__observed_but_not_aged__age_and_stale_written_as_null(
    surface_name: str,
) -> None:
    fresh = _proposals(surface_name)[0]
    result = Succeeded(
        call_id=fresh.call_id, tool_name=fresh.tool_name, output={"temperature": 1.0},
        observed_at=OBSERVED_AT,
    )
    rest = [
        Succeeded(call_id=p.call_id, tool_name=p.tool_name) for p in _proposals(surface_name)[1:]
    ]

    [back, *_] = DRIVERS[surface_name].read_back(
        SURFACES[surface_name].write_results(_proposals(surface_name), [result, *rest])
    )

    assert back.payload["observed_at"] == "2024-05-01T10:00:00.250Z"
    assert (back.payload["age_seconds"], back.payload["stale"]) == (None, None)
