"""ops/grafana and ops/alerts.yml name only metrics toolfence exports.

Metric names are a contract (executor/telemetry/metrics.py, executor/telemetry/exporter.py): a
dashboard panel or an alert on a misspelt name shows nothing and never fires,
silently. That the expressions parse is checked against a real Prometheus in
tests/integration/test_ops_prometheus.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from executor.telemetry import metrics
from executor.telemetry.exporter import DatabaseCollector, ExporterConfig

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "ops" / "grafana" / "toolfence.json"
ALERTS = ROOT / "ops" / "alerts.yml"
METRIC_NAME = re.compile(r"\btoolfence_[a-z_]+")
# The sample names a metric family of each type exposes.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed_names() -> set[str]:
    families: dict[str, str] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                families[family.name] = family.type
    for family in DatabaseCollector("sqlite://", ExporterConfig()).describe():
        families[family.name] = family.type
    return {name + suffix for name, kind in families.items() for suffix in SUFFIXES[kind]}


def dashboard() -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_expressions() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [str(rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def test_exposed_names__include_both_sources() -> None:
    names = exposed_names()

    assert "toolfence_operations_terminal_total" in names
    assert "toolfence_enqueue_to_terminal_seconds_bucket" in names
    assert "toolfence_invariant_violations" in names
    assert "toolfence_exporter_scrape_errors_total" in names
    # A counter is never exposed without its suffix, so this would be a typo.
    assert "toolfence_operations_terminal" not in names


@pytest.mark.parametrize(
    "expr",
    [pytest.param(e, id=f"dashboard-{i}") for i, e in enumerate(dashboard_expressions())]
    + [pytest.param(e, id=f"alert-{i}") for i, e in enumerate(alert_expressions())],
)
def test_expression__names_only_exported_metrics(expr: str) -> None:
    used = set(METRIC_NAME.findall(expr))

    # Prometheus's own `up` is the one other series an expression may stand on.
    assert used or expr.startswith("up{"), f"no toolfence metric in {expr}"
    assert used - exposed_names() == set(), expr


def test_dashboard__is_a_grafana_dashboard_on_the_prometheus_datasource() -> None:
    document = dashboard()
    variables = {v["name"]: v for v in document["templating"]["list"]}

    assert document["uid"] == "toolfence"
    assert isinstance(document["schemaVersion"], int)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == "prometheus"
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
    ids = [p["id"] for p in document["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard__panels_do_not_overlap() -> None:
    occupied: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in occupied, f"{panel['title']} overlaps {occupied[(x, y)]}"
                occupied[(x, y)] = panel["title"]


@pytest.mark.parametrize(
    ("what", "metric"),
    [
        ("throughput", "toolfence_operations_terminal_total"),
        ("latency", "toolfence_enqueue_to_terminal_seconds_bucket"),
        ("side effects per operation", "toolfence_side_effects_per_operation_count"),
        ("fenced stale writes", "toolfence_stale_writes_fenced_total"),
        ("outbox lag", "toolfence_outbox_oldest_unpublished_age_seconds"),
        ("reconciliation backlog", "toolfence_reconciliation_pending"),
        ("invariant violations", "toolfence_invariant_violations"),
        ("lease takeovers", "toolfence_lease_takeovers_total"),
        ("retries", "toolfence_retries_total"),
        # issue 28: turns, the HTTP API, approvals waiting, relay publish latency
        ("turns running and waiting approval", "toolfence_turns_active"),
        ("turns ended by reason", "toolfence_turns_ended_total"),
        ("steps per turn", "toolfence_turn_steps_bucket"),
        ("tokens", "toolfence_model_tokens_total"),
        ("HTTP rate and status codes", "toolfence_http_responses_total"),
        ("HTTP latency", "toolfence_http_request_seconds_bucket"),
        ("approvals waiting (count)", "toolfence_operations_active"),
        ("approvals waiting (oldest age)", "toolfence_approvals_waiting_oldest_age_seconds"),
        ("relay publish latency", "toolfence_relay_publish_seconds_bucket"),
    ],
)
def test_dashboard__has_a_panel_for(what: str, metric: str) -> None:
    assert any(metric in set(METRIC_NAME.findall(e)) for e in dashboard_expressions()), what


@pytest.mark.parametrize(
    "histogram",
    ["toolfence_enqueue_to_terminal", "toolfence_http_request_seconds", "toolfence_relay_publish_seconds"],
)
def test_dashboard__latency_panel_shows_p50_and_p99(histogram: str) -> None:
    latency = [e for e in dashboard_expressions() if histogram in e]

    assert any(e.startswith("histogram_quantile(0.5,") for e in latency)
    assert any(e.startswith("histogram_quantile(0.99,") for e in latency)


def test_dashboard__approvals_waiting_panel_counts_pending_approval_operations() -> None:
    assert 'sum(toolfence_operations_active{state="pending_approval"})' in dashboard_expressions()


def test_grafana_provisioning__datasource_uid_and_dashboard_path_match_compose() -> None:
    provisioning = ROOT / "ops" / "grafana" / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    providers = yaml.safe_load((provisioning / "dashboards" / "toolfence.yml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())

    (datasource,) = datasources["datasources"]
    assert datasource["uid"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    (provider,) = providers["providers"]
    mounted = {
        volume.split(":")[1]
        for volume in compose["services"]["grafana"]["volumes"]
        if volume.startswith("./ops/grafana/toolfence.json:")
    }
    assert mounted == {provider["options"]["path"] + "/toolfence.json"}
