"""The audit hook's verdict (pure): a second model call reviews a candidate final
answer and answers one of four verdicts.

- `emit`: send the candidate;
- `suppress`: withhold it (the turn ends `fallback`, the fallback output is sent);
- `deny_and_read`: reject it and run these *read* tools first; the model then
  answers again with their results;
- `ask_user`: reject it and ask the user the audit's question instead.

The audit may request read tools only: its prompt lists only reads, and a
verdict naming any other tool is refused here, whatever the prompt said. When
the audit fails (driver error, timeout, an output that is no verdict, a write
requested), the candidate is emitted and the failure recorded: a quality gate,
never a security gate (security is admission's, on every call).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from executor.core.types import ProposedCall
from executor.turns.contract import ContractError, ToolCalls, excerpt, parse_json_contract


class Verdict(StrEnum):
    EMIT = "emit"
    SUPPRESS = "suppress"
    DENY_AND_READ = "deny_and_read"
    ASK_USER = "ask_user"
    FAILED = "failed"  # the audit itself failed: the candidate is emitted


@dataclass(frozen=True)
class AuditOutcome:
    verdict: Verdict
    proposals: tuple[ProposedCall, ...] = ()
    question: str | None = None
    failure: str | None = None  # a stable code when verdict is FAILED
    excerpt: str | None = None


def failed(code: str, text: str = "") -> AuditOutcome:
    return AuditOutcome(Verdict.FAILED, failure=code, excerpt=excerpt(text) if text else None)


def parse_verdict(text: str, read_tools: Iterable[str]) -> AuditOutcome:
    """The audit's output: one JSON object with `verdict`. A `deny_and_read` naming a
    tool outside `read_tools` fails the audit (enforcement, not only the prompt)."""
    try:
        value = json.loads(text.strip())
    except (ValueError, RecursionError):
        return failed("not_json", text)
    if not isinstance(value, dict) or not isinstance(value.get("verdict"), str):
        return failed("no_verdict", text)
    try:
        verdict = Verdict(value["verdict"])
    except ValueError:
        return failed("unknown_verdict", text)
    if verdict is Verdict.FAILED:
        return failed("unknown_verdict", text)
    if verdict is Verdict.ASK_USER:
        question = value.get("question")
        if not isinstance(question, str) or not question.strip():
            return failed("no_question", text)
        return AuditOutcome(verdict, question=question)
    if verdict is Verdict.DENY_AND_READ:
        parsed = parse_json_contract(json.dumps({"tool_calls": value.get("tool_calls", [])}))
        if isinstance(parsed, ContractError) or not isinstance(parsed, ToolCalls):
            return failed("bad_tool_calls", text)
        allowed = set(read_tools)
        if any(p.tool_name not in allowed for p in parsed.proposals):
            return failed("write_requested", text)
        return AuditOutcome(verdict, proposals=parsed.proposals)
    return AuditOutcome(verdict)
