"""Timing the sanitiser as ratios, never seconds (shared by both sanitiser test files).

Noise on a shared machine only ever adds time, so each text's cost is the least of
several timings, taken in turns so that a busy spell is spread over all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from executor.core.sanitize import sanitize_text


def _sanitize(text: str) -> object:
    return sanitize_text(text, len(text))


def costs(
    *texts: str, rounds: int = 7, scan: Callable[[str], object] = _sanitize
) -> list[float]:
    best = [float("inf")] * len(texts)
    for _ in range(rounds):
        for index, text in enumerate(texts):
            started = time.perf_counter()
            scan(text)
            best[index] = min(best[index], time.perf_counter() - started)
    return best


def plain(n: int) -> str:
    return ("The quick brown fox jumps over the lazy dog, again and again. " * (n // 60 + 1))[:n]


def assert_linear(shape: str, make: Callable[[int], str], n: int = 32_000) -> None:
    """Quadratic patterns cost hundreds of times plain text at this length, and
    sixteen times as much at 4n; linear ones a small constant, and four times."""
    # Noise only ever adds time, but a busy spell can outlast all seven rounds of
    # one text (it did under make test's three tiers: 8.7 once, 4.0 alone), so a
    # shape gets three measurements; a quadratic one fails every one of them.
    for _ in range(3):
        plain_cost, hostile, hostile_quadrupled = costs(plain(n), make(n), make(4 * n))
        # 8 keeps clear of both 4 (linear) and 16 (quadratic) on a loaded machine.
        if hostile / plain_cost < 30 and hostile_quadrupled / hostile < 8:
            return
    assert hostile / plain_cost < 30, (shape, hostile, plain_cost)
    assert hostile_quadrupled / hostile < 8, (shape, hostile_quadrupled, hostile)
