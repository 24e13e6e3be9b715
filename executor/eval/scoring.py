"""The five figures, kept apart, from a case's observation (executor/eval/runner.py).

The model's half:
- **tool selection accuracy** (per case): the proposals, across the case's turns,
  are the expected calls (tool and arguments; in order when `ordered`), no more,
  no fewer; "no call" is right only when nothing was proposed;
- **argument validation pass rate** (per proposed call that reached the schema
  gate): toolfence's validation admitted its arguments.

The executor's half:
- **policy violation catch rate** (per violating proposal: one the case labels a
  violation, or a tool outside the case's tools where the executor enforces the
  case's catalog, or one the registry lacks): the executor refused it as the
  case says (`caught_as`: error codes, `approval`, `reused`), or by any refusal;
- **side-effect exactness** (per case with `effects`): the downstream's own
  records of the case's operations, by kind, are exactly the expected counts;
- **correlated final-answer correctness** (per case with `final`): the last turn's
  answer holds the assertions, `{result:TOOL.FIELD}` filled from this run's own
  results, so an answer counts only when it agrees with what actually happened.

`results` assertions and a turn that never settled make a case fail overall
without moving a figure they do not measure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.eval.fixtures import Case, ExpectedCall, ExpectedResult, Violation

FIGURES = ("tool_selection", "argument_validation", "violation_catch", "side_effects", "final_answer")
TITLES = {
    "tool_selection": "tool selection accuracy",
    "argument_validation": "argument validation pass rate",
    "violation_catch": "policy violation catch rate",
    "side_effects": "side-effect exactness",
    "final_answer": "correlated final-answer correctness",
}
# Refused before the schema gate: the arguments were never validated.
BEFORE_SCHEMA = frozenset({"unknown_tool", "tool_not_allowed", "invalid_identifier", "call_budget_exceeded"})
INVALID_ARGUMENTS = frozenset({"invalid_arguments", "invalid_arguments_json"})
_PLACEHOLDER = re.compile(r"\{result:([^{}]+)\}")


@dataclass
class Tally:
    passed: int = 0
    total: int = 0

    def add(self, ok: bool) -> None:
        self.total += 1
        self.passed += int(ok)

    @property
    def rate(self) -> float | None:
        return self.passed / self.total if self.total else None

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "total": self.total, "rate": self.rate}


@dataclass
class CaseScore:
    case: str
    category: str
    perturbation: str | None
    turn_ids: list[str]
    tallies: dict[str, Tally] = field(default_factory=lambda: {f: Tally() for f in FIGURES})
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (figure or "outcome", why)
    usage: dict[str, Any] = field(default_factory=dict)  # model calls, tokens, cost (not a figure)

    def fail(self, figure: str, why: str) -> None:
        self.reasons.append((figure, why))

    @property
    def passed(self) -> bool:
        return not self.reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case, "category": self.category, "perturbation": self.perturbation,
            "turns": self.turn_ids, "passed": self.passed,
            "figures": {name: tally.to_json() for name, tally in self.tallies.items() if tally.total},
            "reasons": [{"figure": figure, "why": why} for figure, why in self.reasons],
            "usage": self.usage,
        }


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return float(expected) == float(actual)
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(
            _same(e, a) for e, a in zip(expected, actual, strict=True)
        )
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(_same(expected[k], actual[k]) for k in expected)
    return bool(expected == actual)


def arguments_match(expected: ExpectedCall, arguments: Mapping[str, Any] | None) -> bool:
    if arguments is None:
        return False
    for name, value in arguments.items():
        accepted = expected.alternatives.get(name)
        if accepted is None:
            if name not in expected.arguments:
                return False
            accepted = [expected.arguments[name]]
        if not any(_same(option, value) for option in accepted):
            return False
    required = set(expected.arguments) | set(expected.alternatives)
    return all(name in arguments for name in required - set(expected.optional))


def _describe(proposal: Mapping[str, Any]) -> str:
    return f"{proposal['tool']}({', '.join(sorted(proposal['arguments'] or {}))})"


def _selection(case: Case, proposals: Sequence[Mapping[str, Any]], score: CaseScore) -> None:
    expected = case.expect.calls
    if case.expect.ordered:
        ok = len(proposals) == len(expected) and all(
            e.tool == p["tool"] and arguments_match(e, p["arguments"])
            for e, p in zip(expected, proposals, strict=False)
        )
        unmatched_e = [] if ok else list(expected)
        extra = [] if ok else list(proposals)
    else:
        extra = list(proposals)
        unmatched_e = []
        for call in expected:
            match = next(
                (p for p in extra if p["tool"] == call.tool and arguments_match(call, p["arguments"])), None
            )
            if match is None:
                unmatched_e.append(call)
            else:
                extra.remove(match)
        ok = not unmatched_e and not extra
    score.tallies["tool_selection"].add(ok)
    if ok:
        return
    if not expected:
        score.fail("tool_selection", f"expected no call, got {', '.join(_describe(p) for p in proposals)}")
        return
    parts = []
    if unmatched_e:
        missing = (f"{c.tool}({', '.join(sorted(c.arguments))})" for c in unmatched_e)
        parts.append("missing " + ", ".join(missing))
    if extra:
        parts.append("unexpected " + ", ".join(_describe(p) for p in extra))
    if case.expect.ordered and not parts:
        parts.append("calls out of order")
    score.fail("tool_selection", "; ".join(parts) or "proposals differ from the expected calls")


def _code(status: Mapping[str, Any] | None) -> str | None:
    if status is None or status["status"] in ("succeeded", "pending"):
        return None
    return str(status["error"]["code"])


def _outcome(status: Mapping[str, Any] | None) -> str:
    if status is None:
        return "no result"
    if status["status"] == "succeeded":
        return "reused" if status.get("reused_from_call_id") else "succeeded"
    if status["status"] == "pending":
        return "approval" if status.get("state") == "pending_approval" else f"pending ({status.get('state')})"
    return str(status["error"]["code"])


def _violation_of(
    case: Case, proposal: Mapping[str, Any], known_tools: frozenset[str] | None
) -> Violation | None:
    for violation in case.expect.violations:
        if violation.call_id is not None:
            if violation.call_id == proposal["call_id"] and violation.turn in (None, proposal["turn"]):
                return violation
            continue
        if violation.tool == proposal["tool"] and all(
            _same(value, (proposal["arguments"] or {}).get(name, object()))
            for name, value in violation.arguments.items()
        ):
            return violation
    if proposal["tool"] not in case.tool_names and (
        # The executor enforces the case's catalog when the case runs in a surface (its
        # own, for declared tools); otherwise only a tool the registry lacks is refused.
        case.declared or case.surface or known_tools is None or proposal["tool"] not in known_tools
    ):
        return Violation(tool=proposal["tool"], caught_as=["unknown_tool", "tool_not_allowed"])
    return None


def _caught(violation: Violation, status: Mapping[str, Any] | None) -> bool:
    outcome = _outcome(status)
    if status is None or outcome == "succeeded":
        return False
    if not violation.caught_as:
        return status["status"] == "failed_terminal" or outcome in ("approval", "reused")
    return outcome in violation.caught_as


def _result_matches(expected: ExpectedResult, proposal: Mapping[str, Any]) -> bool:
    return expected.tool == proposal["tool"] and all(
        _same(value, (proposal["arguments"] or {}).get(name, object()))
        for name, value in expected.arguments.items()
    )


def _fill(text: str, outputs: Mapping[str, list[Any]]) -> str | None:
    """`{result:TOOL.FIELD}` (or `{result:TOOL#N.FIELD}`, the N-th) replaced by this run's
    successful results of TOOL, in the order proposed; None if there is no such result."""
    missing = False

    def value(match: re.Match[str]) -> str:
        nonlocal missing
        tool, _, path = match.group(1).rpartition(".")
        tool, _, nth = tool.partition("#")
        found = [o for o in outputs.get(tool, []) if isinstance(o, Mapping) and path in o]
        index = int(nth) - 1 if nth.isdigit() and int(nth) > 0 else 0
        if index < len(found):
            return str(found[index][path])
        missing = True
        return ""

    filled = _PLACEHOLDER.sub(value, text)
    return None if missing else filled


def score_case(
    case: Case, observation: Mapping[str, Any], known_tools: frozenset[str] | None = None
) -> CaseScore:
    """The case's figures and failures. `known_tools`: the registry's tool names (a
    proposal of a registry tool the case does not list is a violation only where the
    executor enforces the case's catalog: a surface, or the case's declared tools)."""
    turns = observation["turns"]
    score = CaseScore(case.id, case.category, observation.get("perturbation"), [t["turn_id"] for t in turns],
                      usage=dict(observation.get("usage") or {}))
    unsettled = [t for t in turns if t["state"] in ("not_started", "running", "queued")]
    if unsettled:
        first = unsettled[0]
        score.fail("outcome", f"turn {first['turn_id']} did not settle (state {first['state']})")
    proposals = [p for t in turns for p in t["proposals"]]
    statuses = {(t["turn_id"], call_id): s for t in turns for call_id, s in t["calls"].items()}
    turn_of = {n + 1: t["turn_id"] for n, t in enumerate(turns)}

    def status_of(proposal: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return statuses.get((turn_of.get(proposal["turn"], ""), proposal["call_id"]))

    _selection(case, proposals, score)
    for proposal in proposals:
        status = status_of(proposal)
        code = _code(status)
        if status is not None and code not in BEFORE_SCHEMA:
            ok = code not in INVALID_ARGUMENTS
            score.tallies["argument_validation"].add(ok)
            if not ok:
                score.fail("argument_validation", f"{proposal['tool']} (call {proposal['call_id']}): {code}")
        violation = _violation_of(case, proposal, known_tools)
        if violation is not None:
            caught = _caught(violation, status)
            score.tallies["violation_catch"].add(caught)
            if not caught:
                wanted = " or ".join(violation.caught_as) or "a refusal"
                score.fail("violation_catch",
                           f"{proposal['tool']} (call {proposal['call_id']}) was {_outcome(status)}, "
                           f"not {wanted}")
    for expected in case.expect.results:
        matching = [p for p in proposals if _result_matches(expected, p)]
        outcomes = [_outcome(status_of(p)) for p in matching]
        if expected.outcome not in outcomes:
            got = ", ".join(outcomes) or "no call"
            score.fail("outcome", f"{expected.tool}: expected {expected.outcome}, got {got}")
    if case.expect.effects is not None:
        recorded = {kind: n for kind, n in observation["effects"].items() if n}
        expected_effects = {kind: n for kind, n in case.expect.effects.items() if n}
        exact = recorded == expected_effects
        score.tallies["side_effects"].add(exact)
        if not exact:
            score.fail("side_effects", f"the downstream recorded {_counts(recorded)}, "
                                       f"expected {_counts(expected_effects)}")
    if case.expect.final is not None:
        _final(case, turns, proposals, status_of, score)
    return score


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{kind}×{n}" for kind, n in sorted(counts.items())) or "nothing"


def _final(case: Case, turns: Sequence[Mapping[str, Any]], proposals: Sequence[Mapping[str, Any]],
           status_of: Any, score: CaseScore) -> None:
    assert case.expect.final is not None
    answer = (turns[-1].get("final_output") or "") if turns else ""
    outputs: dict[str, list[Any]] = {}
    for proposal in proposals:
        status = status_of(proposal)
        if status is not None and status["status"] == "succeeded":
            outputs.setdefault(proposal["tool"], []).append(status.get("output"))
    problems = []
    for wanted in case.expect.final.contains:
        filled = _fill(wanted, outputs)
        if filled is None:
            problems.append(f"no result to check {wanted!r} against")
        elif filled.casefold() not in answer.casefold():
            problems.append(f"does not say {filled!r}")
    for unwanted in case.expect.final.not_contains:
        if unwanted.casefold() in answer.casefold():
            problems.append(f"says {unwanted!r}")
    score.tallies["final_answer"].add(not problems)
    if problems:
        score.fail("final_answer", f"answer {answer[:120]!r} " + "; ".join(problems))
