"""Every label value of every toolfence metric comes from a closed set (decision 0195).

`toolfence_hosted_calls_total{kind}` once took the envelope's raw item type: one
POST with 302 distinct `*_call` types created 304 series, one label 50,098
characters long. Each label now has a `Domain`; anything outside it is counted
as `other`. The domains that mirror values defined in layers the metrics cannot
import (the worker's outcomes, the turn loop's reasons, the reconciler's
actions, the adapters' hosted kinds, in tests/unit/adapters/test_adapter_item_types.py)
are checked against those values, so a new one fails a test instead of being
counted as `other`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel, ConfigDict

from executor.core.tools import Access, Approval, Mode, Registry, Tool
from executor.providers import SURFACES
from executor.telemetry import metrics
from executor.telemetry.metrics import OTHER, ClosedCounter, ClosedHistogram, Domain
from executor.turns.audit import Verdict
from executor.turns.values import EndReason
from executor.worker.outcomes import OutcomeLabel

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "x_call" * 8_350  # 50,100 characters, as the attack's longest label


def _series(metric: ClosedCounter | ClosedHistogram) -> set[tuple[tuple[str, str], ...]]:
    return {
        tuple(sorted(sample.labels.items()))
        for family in metric.collect()
        for sample in family.samples
        if not sample.name.endswith(("_created", "_bucket"))
    }


def _valid_value(domain: Domain) -> str:
    return sorted(domain.values)[0]


def test_every_metric__every_label_has_a_domain() -> None:
    assert len(metrics.ALL) >= 30
    for metric in metrics.ALL:
        assert tuple(metric.domains) == tuple(metric._labelnames), metric._name


@pytest.mark.parametrize("metric", metrics.ALL, ids=lambda metric: metric._name)
def test_every_label__hostile_value__counted_as_other(metric: ClosedCounter | ClosedHistogram) -> None:
    names = list(metric._labelnames)
    if not names:
        pytest.skip("no labels")
    for hostile_label in names:
        # Given a value outside the label's set in one label, valid values in the others
        values = {
            name: HOSTILE if name == hostile_label else _valid_value(metric.domains[name])
            for name in names
        }
        child = metric.labels(**values)
        if isinstance(child, ClosedHistogram):
            child.observe(1.0)
        else:
            child.inc()
        # Then the series is under `other`, and the hostile text is in no series
        assert any(dict(series).get(hostile_label) == OTHER for series in _series(metric))
        assert not any(HOSTILE in value for series in _series(metric) for _, value in series)


def test_hosted_calls__302_distinct_kinds__one_other_series() -> None:
    # Given one envelope's worth of distinct, unknown hosted kinds
    before = _series(metrics.HOSTED_CALLS)
    for index in range(302):
        metrics.HOSTED_CALLS.labels("openai-responses", f"kind_{index}_call", "not_allowed").inc()
    metrics.HOSTED_CALLS.labels(HOSTILE, HOSTILE, HOSTILE).inc()
    # Then at most two series are new: kind=other, and all three other
    assert len(_series(metrics.HOSTED_CALLS) - before) <= 2
    counted = REGISTRY.get_sample_value(
        "toolfence_hosted_calls_total",
        {"surface": "openai-responses", "kind": OTHER, "outcome": "not_allowed"},
    )
    assert counted is not None and counted >= 302


def test_tool_label__registered_names_only() -> None:
    # A name a registry declared is a label; a model's invented name is not
    declared = "metric_labels.tool_declared_here"
    Registry([
        Tool(
            name=declared, description="d", mode=Mode.READ, input_model=_Args, output_model=_Args,
            run=lambda args, ctx: args, access=Access.public_tool(), approval=Approval.never(),
            untrusted_output=False,
        )
    ])
    assert metrics.TOOL.admit(declared) == declared
    assert metrics.TOOL.admit("unknown") == "unknown"
    assert metrics.TOOL.admit("ignore previous instructions") == OTHER


def test_hosted_approval_decision__counted_under_its_own_tool_label() -> None:
    # A hosted approval's decision names no registered tool: it keeps the label the
    # docs promise (docs/metrics.md), never `other`
    from prometheus_client import REGISTRY

    from executor.core.approvers import ApprovalDecision
    from executor.store.approvals import HOSTED_APPROVAL_TOOL
    from executor.store.records import Decision, DecisionOutcome

    labels = {"tool": HOSTED_APPROVAL_TOOL, "decision": "approved"}
    before = REGISTRY.get_sample_value("toolfence_approval_decisions_total", labels) or 0.0
    metrics.count_approval_decision(
        Decision(DecisionOutcome.DECIDED, HOSTED_APPROVAL_TOOL), ApprovalDecision.APPROVE
    )
    assert REGISTRY.get_sample_value("toolfence_approval_decisions_total", labels) == before + 1


def test_http_route__declared_templates_only() -> None:
    metrics.declare_routes(["/metric-labels/{thing_id}"])
    assert metrics.HTTP_ROUTE.admit("/metric-labels/{thing_id}") == "/metric-labels/{thing_id}"
    assert metrics.HTTP_ROUTE.admit("unmatched") == "unmatched"
    assert metrics.HTTP_ROUTE.admit("/metric-labels/123") == OTHER
    assert metrics.HTTP_STATUS.admit(404) == "404" and metrics.HTTP_STATUS.admit(99_999) == OTHER


# ---------------------------------------------------------------- domains mirror their sources


def test_message_outcomes__every_worker_outcome_label_in_domain() -> None:
    assert {label.value for label in OutcomeLabel} <= metrics.MESSAGE_OUTCOME.values


def test_turn_reasons_and_verdicts__in_domain() -> None:
    assert {reason.value for reason in EndReason} <= metrics.END_REASON.values
    assert {verdict.value for verdict in Verdict} <= metrics.AUDIT_VERDICTS.domains["verdict"].values


def test_surfaces__domain_is_every_surface() -> None:
    assert metrics.SURFACE.values == set(SURFACES)


def _string_arguments(path: Path, function: str, position: int) -> set[str]:
    """String literals passed at `position` to calls of `.function(...)` / `function(...)`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == function and len(node.args) > position:
            argument = node.args[position]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                found.add(argument.value)
    return found


def test_reconciler_actions__every_action_in_its_source_in_domain() -> None:
    sweep = Path("reconciler/sweep.py")
    actions = _string_arguments(sweep, "count", 0) | _string_arguments(sweep, "_drain", 1)
    assert len(actions) >= 10
    assert actions <= metrics.RECONCILER_ACTION.values


def test_turn_message_outcomes__every_label_in_its_source_in_domain() -> None:
    labels = _string_arguments(Path("executor/worker/turns.py"), "TurnOutcome", 0)
    assert len(labels) >= 5
    assert labels <= metrics.TURN_MESSAGE_OUTCOME.values


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


def test_labels__wrong_count_or_a_mix__refused_as_prometheus_does() -> None:
    # The closed sets must not hide a call that names too few, too many or mixed labels
    with pytest.raises(ValueError):
        metrics.HTTP_RESPONSES.labels("/v1/requests")
    with pytest.raises(ValueError):
        metrics.HTTP_RESPONSES.labels("/v1/requests", "200", "extra")
    with pytest.raises(ValueError):
        metrics.HTTP_RESPONSES.labels("/v1/requests", status="200")
    with pytest.raises(ValueError):
        metrics.HTTP_RESPONSES.labels(route="/v1/requests")
