"""The chaos campaign's marker: `pytest -m chaos` runs it alone, `-m "not chaos"` skips it."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaos: the CI-sized fault-injection campaign (real fleet, private PostgreSQL and Redis; "
        "about four minutes)",
    )
