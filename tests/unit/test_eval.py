"""`toolfence eval`'s pure parts: the fixtures loader's errors, scoring of the five
figures, the perturbing driver's plans, BFCL's conversion and the comparison."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from executor.eval.bfcl import convert, json_schema
from executor.eval.declared import build_registry
from executor.eval.drivers import plan_cases
from executor.eval.fixtures import Case, FixtureError, Fixtures, Header, load_fixtures, parse_lines
from executor.eval.report import build_report, compare, failure_ratio, markdown, regressions
from executor.eval.runner import check_cases
from executor.eval.scoring import score_case

HEADER = {
    "eval": 1, "tools": "executor.eval.declared:registry", "downstream": "executor.eval.declared:downstream",
}
ADD = {"name": "math.add", "description": "Add.", "parameters": {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "note": {"type": "string"}},
    "required": ["a", "b"]}}


def case(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "add-1", "category": "simple", "messages": ["add 1 and 2"], "tools": [ADD],
        "expect": {"calls": [{"tool": "math.add", "arguments": {"a": 1, "b": 2}}],
                   "effects": {"math.add": 1}},
    }
    base.update(overrides)
    return base


def lines(*cases: dict[str, Any]) -> list[str]:
    return [json.dumps(HEADER), *(json.dumps(c) for c in cases)]


@pytest.mark.parametrize(("text", "expected"), [
    ("{not json", "fixtures:2: not JSON"),
    ("[1, 2]", "fixtures:2: a line is a JSON object, not list"),
    (json.dumps(case(messages=[])), "fixtures:2: messages: List should have at least 1 item"),
    (json.dumps(case(id="bad id!")), "fixtures:2: id: String should match pattern"),
    (json.dumps(case(expect={"calls": [], "surprise": 1})), "fixtures:2: expect.surprise: Extra inputs"),
    (json.dumps(case(expect={"calls": [{"tool": "math.add", "turn": 2}]})), "expect.calls names turn 2"),
    (json.dumps(case(messages=["a\u0000b"])), "messages: Value error, a message holds no NUL"),
])
def test_fixtures__a_bad_line__is_named_with_its_field(text: str, expected: str) -> None:
    with pytest.raises(FixtureError) as raised:
        parse_lines([json.dumps(HEADER), text])
    assert expected in str(raised.value)


def test_fixtures__header_first_and_ids_once() -> None:
    with pytest.raises(FixtureError, match="fixtures:1: the first line is the header"):
        parse_lines([json.dumps(case())])
    with pytest.raises(FixtureError, match="case id 'add-1' is already used on line 2"):
        parse_lines(lines(case(), case()))
    with pytest.raises(FixtureError, match="a header and no case"):
        parse_lines(lines())


def test_fixtures__the_shipped_ledger_file_loads(tmp_path: Path) -> None:
    fixtures = load_fixtures(Path(__file__).parents[2] / "ledger" / "eval" / "ledger.jsonl")
    assert {c.category for c in fixtures.cases} == {
        "parallel_reads", "unknown_tool", "tenancy", "payments", "approval", "multi_turn"}


def observation(
    proposals: list[dict[str, Any]], calls: dict[str, Any], *, effects: dict[str, int] | None = None,
    final: str | None = "Done.", state: str = "succeeded",
) -> dict[str, Any]:
    return {"case": "add-1", "category": "simple", "perturbation": None, "effects": effects or {},
            "turns": [{"turn_id": "t1", "state": state, "final_output": final, "proposals": proposals,
                       "calls": calls}]}


def proposal(call_id: str, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"turn": 1, "step": 1, "call_id": call_id, "tool": tool, "arguments": arguments}


def ok(call_id: str, tool: str, output: Any = None) -> dict[str, Any]:
    return {"status": "succeeded", "call_id": call_id, "tool_name": tool, "operation_id": f"op-{call_id}",
            "output": output}


def refused(call_id: str, tool: str, code: str) -> dict[str, Any]:
    return {"status": "failed_terminal", "call_id": call_id, "tool_name": tool, "error": {"code": code}}


def parsed(raw: dict[str, Any]) -> Case:
    return Case.model_validate(raw)


def test_scoring__right_call_and_effect__every_measured_figure_passes() -> None:
    score = score_case(parsed(case()), observation([proposal("c1", "math.add", a=1, b=2.0)],
                                                    {"c1": ok("c1", "math.add")}, effects={"math.add": 1}))
    assert score.passed
    assert {k: (t.passed, t.total) for k, t in score.tallies.items() if t.total} == {
        "tool_selection": (1, 1), "argument_validation": (1, 1), "side_effects": (1, 1)}


def test_scoring__figures_are_kept_apart() -> None:
    # A model that proposed an undeclared argument (model half) and an executor that
    # refused it, with the downstream untouched (executor half)
    raw = case(expect={"calls": [{"tool": "math.add", "arguments": {"a": 1, "b": 2}}], "effects": {},
                       "violations": [{"tool": "math.add", "arguments": {"note": "x"}}]})
    score = score_case(parsed(raw), observation(
        [proposal("c1", "math.add", a=1, b=2, note="x")],
        {"c1": refused("c1", "math.add", "invalid_arguments")}))
    figures = {k: (t.passed, t.total) for k, t in score.tallies.items() if t.total}
    assert figures == {"tool_selection": (0, 1), "argument_validation": (0, 1), "violation_catch": (1, 1),
                       "side_effects": (1, 1)}
    assert [figure for figure, _ in score.reasons] == ["tool_selection", "argument_validation"]


def test_scoring__an_uncaught_violation_and_a_side_effect_too_many() -> None:
    raw = case(expect={"calls": [], "effects": {}})
    score = score_case(parsed(raw), observation(
        [proposal("c1", "math.add", a=1, b=2)], {"c1": ok("c1", "math.add")}, effects={"math.add": 1}))
    reasons = dict(score.reasons)
    assert "expected no call" in reasons["tool_selection"]
    assert reasons["side_effects"] == "the downstream recorded math.add×1, expected nothing"
    assert score.tallies["violation_catch"].total == 0  # math.add is the case's own tool


def test_scoring__a_tool_outside_the_case_is_a_violation_caught_by_unknown_tool() -> None:
    raw = case(expect={"calls": [], "effects": {}})
    score = score_case(parsed(raw), observation(
        [proposal("c1", "math.pow", a=1)], {"c1": refused("c1", "math.pow", "unknown_tool")}))
    assert (score.tallies["violation_catch"].passed, score.tallies["violation_catch"].total) == (1, 1)
    assert score.tallies["argument_validation"].total == 0  # never reached the schema gate


def test_scoring__a_registry_tool_outside_the_case_counts_only_where_the_catalog_is_enforced() -> None:
    named = case(tools=["ledger.get_balance"], expect={"calls": []})
    proposed = [proposal("c1", "ledger.send_notice", account_id="a")]
    calls = {"c1": ok("c1", "ledger.send_notice")}
    known = frozenset({"ledger.get_balance", "ledger.send_notice"})
    # no surface: the executor offers every tool the roles allow, so this is the model's miss only
    unsurfaced = score_case(parsed(named), observation(proposed, calls), known)
    assert unsurfaced.tallies["violation_catch"].total == 0
    # in a surface whose catalog is the case's tools, it is a violation the executor let through
    surfaced = score_case(parsed({**named, "surface": "chat"}), observation(proposed, calls), known)
    assert (surfaced.tallies["violation_catch"].passed, surfaced.tallies["violation_catch"].total) == (0, 1)


def test_scoring__ordered_calls_and_alternatives() -> None:
    raw = case(expect={"calls": [
        {"tool": "math.add", "arguments": {"a": 1, "b": 2}, "alternatives": {"b": [2, 3]}, "optional": ["b"]},
        {"tool": "math.add", "arguments": {"a": 5, "b": 5}}], "ordered": True})
    in_order = [proposal("c1", "math.add", a=1), proposal("c2", "math.add", a=5, b=5)]
    assert score_case(parsed(raw), observation(in_order, {})).tallies["tool_selection"].passed == 1
    reversed_ = list(reversed(in_order))
    assert score_case(parsed(raw), observation(reversed_, {})).tallies["tool_selection"].passed == 0


def test_scoring__final_answer_is_checked_against_this_runs_results() -> None:
    raw = case(expect={"calls": [{"tool": "math.add", "arguments": {"a": 1, "b": 2}}],
                       "final": {"contains": ["{result:math.add.sum}"], "not_contains": ["error"]}})
    calls = {"c1": ok("c1", "math.add", {"sum": 3})}
    proposed = [proposal("c1", "math.add", a=1, b=2)]
    right = score_case(parsed(raw), observation(proposed, calls, final="It is 3."))
    wrong = score_case(parsed(raw), observation(proposed, calls, final="It is 4."))
    assert (right.tallies["final_answer"].passed, wrong.tallies["final_answer"].passed) == (1, 0)
    assert "does not say '3'" in dict(wrong.reasons)["final_answer"]
    none = score_case(parsed(raw), observation([proposal("c1", "math.add", a=1, b=2)],
                                               {"c1": refused("c1", "math.add", "permission_denied")}))
    assert "no result to check" in dict(none.reasons)["final_answer"]


def test_scoring__a_turn_that_never_settled_fails_the_case() -> None:
    score = score_case(parsed(case()), observation([], {}, state="running"))
    assert dict(score.reasons)["outcome"] == "turn t1 did not settle (state running)"


class _Downstream:
    def prepare(self, database_url: str, cases: Any) -> None: ...

    def effects(self, database_url: str, operation_ids: Any) -> dict[str, int]:
        return {}

    def effect_of(self, tool: str) -> str | None:
        return tool


def _fixtures(*raw: dict[str, Any]) -> Fixtures:
    header, cases = parse_lines(lines(*raw))
    return Fixtures(Path("f.jsonl"), header, cases, "0")


@pytest.mark.parametrize(("kind", "calls", "caught_as", "effects"), [
    ("wrong_tool", [("c1", "math.add_unlisted")], ["unknown_tool", "tool_not_allowed"], {"math.add": 0}),
    ("missing_arg", [("c1", "math.add")], ["invalid_arguments"], {"math.add": 0}),
    ("extra_field", [("c1", "math.add")], ["invalid_arguments"], {"math.add": 0}),
    ("other_tenant", [("c1", "math.add")], ["permission_denied", "target_not_offered"], {"math.add": 0}),
    ("repetition", [("c1", "math.add"), ("c1r", "math.add")], ["reused"], {"math.add": 1}),
])
def test_perturb__each_kind_labels_its_call_and_adjusts_the_effects(
    tmp_path: Path, kind: str, calls: list[tuple[str, str]], caught_as: list[str], effects: dict[str, int]
) -> None:
    raw = case(expect={"calls": [{"tool": "math.add", "arguments": {"a": 1, "b": 2, "note": "n"}}],
                       "effects": {"math.add": 1}})
    fixtures = _fixtures(raw)
    [plan] = plan_cases(fixtures, f"perturb:{kind}", tmp_path, registry=build_registry(fixtures.cases),
                        downstream=_Downstream())
    [script] = plan.drivers
    first = json.loads(Path(script.partition(":")[2]).read_text().splitlines()[0])
    assert [(c["id"], c["name"]) for c in first["tool_calls"]] == calls
    [violation] = plan.case.expect.violations
    assert (violation.caught_as, violation.call_id) == (caught_as, calls[-1][0])
    assert plan.case.expect.effects == effects
    if kind == "missing_arg":
        assert "a" not in first["tool_calls"][0]["arguments"]
    if kind == "other_tenant":
        assert first["tool_calls"][0]["arguments"]["note"] == "@globex/n"


def test_perturb__a_kind_that_does_not_apply_gives_way(tmp_path: Path) -> None:
    raw = case(tools=[{**ADD, "mode": "read"}],
               expect={"calls": [{"tool": "math.add", "arguments": {"a": 1, "b": 2}}]})
    fixtures = _fixtures(raw)
    [plan] = plan_cases(fixtures, "perturb:repetition,other_tenant,extra_field", tmp_path,
                        registry=build_registry(fixtures.cases), downstream=_Downstream())
    assert plan.perturbation == "extra_field"  # a read is not repeated; no string to swap


def test_recorded__a_case_without_recording_is_named(tmp_path: Path) -> None:
    recordings = tmp_path / "rec.jsonl"
    recordings.write_text(json.dumps({"case": "other", "turns": [[{"final": "x"}]]}) + "\n")
    with pytest.raises(FixtureError, match="no recording for case\\(s\\) add-1"):
        plan_cases(_fixtures(case()), f"recorded:{recordings}", tmp_path, registry=None,
                   downstream=_Downstream())


def test_bfcl__types_become_json_schema_and_ground_truth_a_case() -> None:
    schema = json_schema({"type": "dict", "properties": {
        "x": {"type": "float"}, "pair": {"type": "tuple", "items": {"type": "integer"}},
        "obj": {"type": "any"}, "cls": {"type": "com.example.Thing"}}, "required": ["x"]})
    assert schema == {"type": "object", "properties": {
        "x": {"type": "number"}, "pair": {"type": "array", "items": {"type": "integer"}},
        "obj": {}, "cls": {}},
        "required": ["x"]}
    question = {"id": "simple_0", "question": [[{"role": "user", "content": "area of 10 by 5"}]],
                "function": [{"name": "area", "parameters": {"type": "dict", "properties": {
                    "base": {"type": "integer"}, "unit": {"type": "string"}}, "required": ["base"]}}]}
    answer = {"id": "simple_0", "ground_truth": [{"area": {"base": [10], "unit": ["units", ""]}}]}
    converted = convert("simple_python", question, answer)
    [call] = converted["expect"]["calls"]
    assert call == {"tool": "area", "arguments": {"base": 10, "unit": "units"},
                    "alternatives": {"base": [10], "unit": ["units"]}, "optional": ["unit"]}
    assert converted["expect"]["effects"] == {"area": 1}
    assert Case.model_validate(converted).messages == ["area of 10 by 5"]


def test_bfcl__the_committed_sample_records_its_dataset_version() -> None:
    fixtures = load_fixtures(Path(__file__).parents[2] / "tests" / "fixtures" / "eval" / "bfcl_sample.jsonl")
    assert fixtures.header.dataset is not None
    assert (fixtures.header.dataset["name"], fixtures.header.dataset["version"]) == ("bfcl-eval", "2026.3.23")
    build_registry(fixtures.cases)  # every declared tool compiles through the MCP schema path


def _report(rates: dict[str, tuple[int, int]]) -> dict[str, Any]:
    figures = {
        name: {"passed": p, "total": t, "rate": p / t if t else None} for name, (p, t) in rates.items()
    }
    return {"driver": "d", "figures": figures, "categories": {"simple": {"figures": figures}}}


def test_compare__regression_is_a_ratio_of_failure_rates() -> None:
    assert failure_ratio({"total": 100, "rate": 0.99}, {"total": 100, "rate": 0.95}) == pytest.approx(5.0)
    assert failure_ratio({"total": 1, "rate": 1.0}, {"total": 1, "rate": 0.0}) == math.inf
    assert failure_ratio({"total": 1, "rate": 1.0}, {"total": 1, "rate": 1.0}) == 1.0
    assert failure_ratio({"total": 0, "rate": None}, {"total": 1, "rate": 1.0}) is None
    full = {n: (1, 1) for n in ("tool_selection", "argument_validation", "violation_catch", "side_effects",
                                "final_answer")}
    baseline = _report({**full, "tool_selection": (99, 100)})
    candidate = _report({**full, "tool_selection": (95, 100)})
    found = regressions(compare(baseline, candidate), threshold=2.0)
    assert [(r["category"], r["figure"]) for r in found] == [
        ("all", "tool_selection"), ("simple", "tool_selection")]
    assert regressions(compare(baseline, candidate), threshold=6.0) == []


def test_report__markdown_lists_each_failing_case_and_why() -> None:
    fixtures = Fixtures(Path("f.jsonl"), Header.model_validate(HEADER), (), "0")
    score = score_case(parsed(case(expect={"calls": [], "effects": {}})), observation(
        [proposal("c1", "math.add", a=1, b=2)], {"c1": ok("c1", "math.add")}, effects={"math.add": 1}))
    report = build_report(fixtures, "perturb", Path("run"), [score])
    text = markdown(report)
    assert "| tool selection accuracy | 0.0 % (0/1) | 0.0 % (0/1) |" in text
    assert "- `add-1` (simple)" in text
    assert "side-effect exactness: the downstream recorded math.add×1, expected nothing" in text


def test_check_cases__a_tool_or_surface_the_registry_lacks_is_refused_before_running() -> None:
    fixtures = _fixtures(case())
    registry = build_registry(fixtures.cases)
    check_cases(fixtures.cases, registry)
    with pytest.raises(FixtureError, match="'named': the registry declares no tool math.pow"):
        check_cases(_fixtures(case(id="named", tools=["math.pow"])).cases, registry)
    with pytest.raises(FixtureError, match="'surfaced': the registry declares no surface 'chat'"):
        check_cases(_fixtures(case(id="surfaced", surface="chat")).cases, registry)


def test_plan__any_other_driver_runs_every_turn_as_given(tmp_path: Path) -> None:
    fixtures = _fixtures(case(messages=["one", "two"]))
    [plan] = plan_cases(fixtures, "cli:my-agent --json", tmp_path, registry=None, downstream=_Downstream())
    assert plan.drivers == ("cli:my-agent --json", "cli:my-agent --json")
    with pytest.raises(FixtureError, match="unknown driver kind"):
        plan_cases(fixtures, "telepathy:model", tmp_path, registry=None, downstream=_Downstream())


def test_report__model_usage_beside_the_figures() -> None:
    fixtures = Fixtures(Path("f.jsonl"), Header.model_validate(HEADER), (), "0")
    priced = {**observation([], {}), "usage": {"model_calls": 2, "input_tokens": 100, "output_tokens": 10,
                                                "cost_usd": 0.25, "cost_known": True}}
    unpriced = {**observation([], {}), "usage": {"model_calls": 1, "input_tokens": 5, "output_tokens": 1,
                                                  "cost_usd": 0.0, "cost_known": False}}
    raw = parsed(case(expect={"calls": []}))
    both = build_report(fixtures, "d", Path("run"), [score_case(raw, priced), score_case(raw, unpriced)])
    assert both["usage"] == {"model_calls": 3, "input_tokens": 105, "output_tokens": 11, "cost_usd": None}
    assert "Model usage: 3 call(s), 105 input and 11 output tokens, cost not reported" in markdown(both)
    one = build_report(fixtures, "d", Path("run"), [score_case(raw, priced)])
    assert "2 call(s), 100 input and 10 output tokens, 0.2500 USD." in markdown(one)
