"""How a provider response ended, and the refusal of every end that is not "finished".

Each surface names its end field (Chat `finish_reason`, Responses `status`,
Anthropic `stop_reason`, Gemini `finishReason`, Interactions `status`) and
classifies every value its SDK defines in an `Endings` table. An end other than
finished is refused as a whole, whatever the response holds (calls, text or
nothing): a cut-off answer read as "no calls" would pass for the model's
finished turn. Deny by default: a value the table does not name is refused as
`unfinished_response`, so a new provider end is never read as a finished one.
An absent end field reads as finished (hand-built envelopes, some proxies).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from executor.providers.common import AdapterError, AdapterErrorCode, quote, truncated


class Ending(StrEnum):
    FINISHED = "finished"
    # The provider paused a long-running turn: send the response back to continue
    # it (Anthropic `pause_turn`). Not a refusal; the surface says how to detect it.
    PAUSED = "paused"
    TRUNCATED = "truncated"
    FILTERED = "filtered"
    UNFINISHED = "unfinished"


@dataclass(frozen=True)
class Endings:
    """One surface's end values, each in exactly one class."""

    field: str
    finished: frozenset[str]
    truncated: frozenset[str]
    filtered: frozenset[str]
    unfinished: frozenset[str]
    paused: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        classes = (self.finished, self.truncated, self.filtered, self.unfinished, self.paused)
        named = [value for values in classes for value in values]
        if len(named) != len(set(named)):
            raise ValueError(f"{self.field}: a value is in more than one class")

    def named(self) -> frozenset[str]:
        """Every value the table classifies explicitly."""
        return self.finished | self.truncated | self.filtered | self.unfinished | self.paused

    def classify(self, value: object) -> Ending:
        if value is None:
            return Ending.FINISHED
        if not isinstance(value, str):
            return Ending.UNFINISHED
        for ending, values in (
            (Ending.FINISHED, self.finished),
            (Ending.PAUSED, self.paused),
            (Ending.TRUNCATED, self.truncated),
            (Ending.FILTERED, self.filtered),
        ):
            if value in values:
                return ending
        return Ending.UNFINISHED


def refuse_unless_finished(
    surface: str, endings: Endings, value: object, *, call_id: object = None, detail: str = ""
) -> Ending:
    """Raise the refusal for `value`'s class; return FINISHED or PAUSED.

    `call_id` names the call being written when the end cut one; `detail` adds
    what the envelope says beside the end value (an incomplete reason).
    """
    ending = endings.classify(value)
    if ending in (Ending.FINISHED, Ending.PAUSED):
        return ending
    said = f"{endings.field} is {quote(value)}{f' ({detail})' if detail else ''}"
    if ending is Ending.TRUNCATED:
        raise truncated(surface, f"{said}: the response was cut off", call_id)
    if ending is Ending.FILTERED:
        raise AdapterError(
            AdapterErrorCode.FILTERED_RESPONSE,
            f"{said}: a content filter stopped the response, or the model refused",
            surface=surface,
        )
    known = isinstance(value, str) and value in endings.unfinished
    raise AdapterError(
        AdapterErrorCode.UNFINISHED_RESPONSE,
        f"{said}: the response is not a finished one"
        + ("" if known else " (an end toolfence does not know)"),
        surface=surface,
    )
