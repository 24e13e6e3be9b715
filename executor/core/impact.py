"""The impact a person decides an approval on: recomputed on current state, digested,
and shown with the tool's display hints.

Admission stores the impact it computed when it asked for the approval; by the time a
person reads the card the world may have moved (another transfer from the same account
was approved). So the console and the API recompute it when a card is shown and again
when the decision is made (`current_impact`: the tool's own `impact` hook, on the
requester's context and the call's validated arguments), and carry the digest of the
impact that was shown (`impact_digest`). An approval whose impact has changed since is
refused `impact_changed` (decision 0222): the person decides again on the new figures.

`Amount` (executor/core/amounts.py) is a tool's display hint for an integer field of
its impact: a currency and its decimals, so `source_balance_cents 45000` reads
`450.00 USD`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from executor.core.canonical import NotCanonicalizable, canonical_json
from executor.errors import AdmissionError

if TYPE_CHECKING:
    from executor.core.tools import Tool
    from executor.core.types import ServerContext

DIGEST_CHARS = 32


class ImpactUnavailable(AdmissionError):
    """The impact could not be recomputed (the tool is gone or changed, its arguments
    no longer validate, its hook raised): nobody may approve on a figure that cannot
    be shown. Carries a fixed reason, never the exception's text."""


def impact_digest(impact: Mapping[str, Any]) -> str:
    """The identity of an impact: a prefix of the SHA-256 of its canonical JSON (key
    order and spacing do not matter; any changed figure does)."""
    try:
        data = canonical_json(dict(impact))
    except NotCanonicalizable:
        data = repr(sorted(impact.items(), key=lambda item: str(item[0]))).encode()
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def current_impact(
    tool: Tool[Any],
    arguments: Mapping[str, Any],
    context: ServerContext,
    approved_resources: list[str] | None,
) -> dict[str, Any]:
    """The impact admission would compute for this call now: the tool's `impact` hook
    (else the redacted default summary) on the validated arguments and the requester's
    context, with the approved resource set added as admission adds it."""
    from executor.core.admission import default_impact, impact_with_resources

    try:
        args = tool.input_model.model_validate(dict(arguments))
    except Exception:
        raise ImpactUnavailable("the call's arguments no longer validate for its tool") from None
    if tool.impact is None:
        impact = default_impact(tool, args)
    else:
        try:
            impact = dict(tool.impact(args, context))
        except Exception:
            raise ImpactUnavailable("the tool's impact hook failed") from None
    resources = frozenset(approved_resources) if approved_resources is not None else None
    return impact_with_resources(impact, resources) or impact
