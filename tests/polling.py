"""Waiting in a test for something another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(condition: Callable[[], bool], within: float, interval: float = 0.02) -> bool:
    """Whether `condition()` became true within `within` seconds (asked every
    `interval`, and once more at the end)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()
