"""A tool's display hint for the integers of its impact (`Tool(amounts=...)`): a
currency and its decimals. Its own module, importing nothing, so the tool
declarations (executor/core/tools.py) and the impact's readers
(executor/core/impact.py) both use it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Amount:
    """A display hint: the impact's field is an integer count of minor units of
    `currency` (cents: `decimals=2`). The figure is shown, never changed: the digest is
    over the impact as the hook returned it."""

    currency: str
    decimals: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.currency, str) or not self.currency.strip():
            raise ValueError("an Amount names its currency")
        decimals = self.decimals
        if not isinstance(decimals, int) or isinstance(decimals, bool) or not 0 <= decimals <= 8:
            raise ValueError("an Amount's decimals is an int from 0 to 8")

    def format(self, value: Any) -> str | None:
        """`value` as `1,234.50 USD`; None when it is not an integer (shown as it is)."""
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        sign = "-" if value < 0 else ""
        whole, minor = divmod(abs(value), 10**self.decimals)
        figure = f"{whole:,}" + (f".{minor:0{self.decimals}d}" if self.decimals else "")
        return f"{sign}{figure} {self.currency}"
