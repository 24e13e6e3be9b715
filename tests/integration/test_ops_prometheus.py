"""ops/ against the real Prometheus: promtool checks the config and the alert rules
and runs their unit tests; a real Prometheus server scrapes a running exporter,
and every dashboard and alert expression is sent to its query API.

promtool and prometheus come from Debian's `prometheus` package
(scripts/ci-deps.sh). Missing, these tests fail: they never skip.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import insert, select

from executor.store.clock import db_now
from executor.store.engine import make_engine
from executor.store.migrate import migrate
from executor.store.schema import operations
from tests.netkit import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
DASHBOARD = OPS / "grafana" / "toolfence.json"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: run scripts/ci-deps.sh (Debian package `prometheus`)"
        )
    return path


def run(args: list[str], cwd: Path = OPS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------- promtool


def test_promtool__check_config__accepts_prometheus_yml() -> None:
    result = run([tool("promtool"), "check", "config", "prometheus.yml"])

    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_promtool__check_rules__accepts_alerts_yml() -> None:
    result = run([tool("promtool"), "check", "rules", "alerts.yml"])

    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool__test_rules__alert_unit_tests_pass() -> None:
    result = run([tool("promtool"), "test", "rules", "alerts_test.yml"])

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alerts_test__every_alert_rule_has_a_unit_test() -> None:
    rules = yaml.safe_load((OPS / "alerts.yml").read_text(encoding="utf-8"))
    tests = yaml.safe_load((OPS / "alerts_test.yml").read_text(encoding="utf-8"))
    alerts = {r["alert"] for group in rules["groups"] for r in group["rules"] if "alert" in r}
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if not case.get("exp_alerts")
    }

    # Each rule is shown both to fire and to stay quiet.
    assert alerts - fired == set()
    assert alerts - quiet == set()


# ----------------------------------------------------------------- a real server


def http_json(url: str, timeout: float = 10.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


def wait_for(what: str, check: Any, timeout: float, process: subprocess.Popen[str]) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"process exited ({process.returncode}) while waiting for {what}")
        try:
            last = check()
        except (OSError, urllib.error.URLError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}: last {last!r}")


def count_invocations(tool_name: str, times: int) -> None:
    """Runs in a spawned child with PROMETHEUS_MULTIPROC_DIR set: a worker counting."""
    from executor.telemetry.metrics import HANDLER_INVOCATIONS
    from tests.metrickit import declare_tools

    declare_tools(tool_name)  # a worker's registry holds the tools it counts
    HANDLER_INVOCATIONS.labels(tool=tool_name).inc(times)
    touch_every_series(tool_name)


def touch_every_series(tool_name: str) -> None:
    """Give every labelled metric one series (at 0: a child's values file holds it
    from `labels()`), as a fleet that ran a while has, so each dashboard panel's
    query has something to return. Label values from each label's own domain."""
    from executor.telemetry import metrics

    metrics.declare_routes(["/v1/requests"])
    for metric in metrics.ALL:
        values = []
        for name in metric._labelnames:
            domain = metric.domains[name]
            if name == "tool":
                values.append(tool_name)
            elif name == "route":
                values.append("/v1/requests")
            else:
                values.append(sorted(domain.values)[0] if domain.values else "x")
        if values:
            metric.labels(*values)


@dataclass
class Stack:
    prometheus_url: str
    exporter_url: str
    exporter: subprocess.Popen[str]
    prometheus: subprocess.Popen[str]

    def query(self, expr: str) -> tuple[int, Any]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        return http_json(url)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("prometheus-stack")

    # A database with one queued operation, so a database gauge reads 1; written
    # without a call row or an audit event, it also violates I4 and I5.
    database_url = f"sqlite:///{base / 'toolfence.db'}"
    migrate(database_url)
    engine = make_engine(database_url)
    with engine.begin() as conn:
        now = float(conn.execute(select(db_now())).scalar_one())
        conn.execute(insert(operations).values(
            operation_id="op-queued", request_id="req-1", call_id="call-1", position=0,
            tool_name="ledger.refund", schema_version=1, mode="write", state="queued",
            intent_hash="0" * 64, arguments="{}", context="{}", available_at=now,
            queued_at=now, created_at=now, updated_at=now,
        ))
    engine.dispose()

    # A worker process's counts in a multiprocess directory.
    metrics_dir = base / "metrics"
    metrics_dir.mkdir()
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    try:
        child = multiprocessing.get_context("spawn").Process(
            target=count_invocations, args=("ledger.refund", 3)
        )
        child.start()
        child.join(timeout=120)
        assert child.exitcode == 0
    finally:
        if previous is None:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = previous

    # Prometheus first: a machine without it fails here, before a process is started
    # that nothing would stop.
    prometheus_binary = tool("prometheus")
    # The exporter, through its real entry point, in its own process.
    exporter_port = free_port()
    exporter_log = base / "exporter.log"
    exporter_output = exporter_log.open("w")
    exporter = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from executor.telemetry.exporter import serve; from executor.settings import Settings;"
         "serve(Settings(database_url=sys.argv[1], broker_url='memory://', metrics_dir=sys.argv[2]),"
         " int(sys.argv[3]), '127.0.0.1')",
         database_url, str(metrics_dir), str(exporter_port)],
        # A file, not a pipe: nobody reads a pipe while the tests run, and a full one
        # would block the process writing to it.
        cwd=ROOT, stdout=exporter_output, stderr=subprocess.STDOUT, text=True,
    )
    exporter_url = f"http://127.0.0.1:{exporter_port}"

    # Prometheus on its own port and storage, scraping every second, with our rules.
    prometheus_port = free_port()
    prometheus_log = base / "prometheus.log"
    prometheus_output = prometheus_log.open("w")
    config = base / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(OPS / "alerts.yml")],
        "scrape_configs": [{
            "job_name": "toolfence",
            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
        }],
    }))
    prometheus = subprocess.Popen(
        [prometheus_binary, f"--config.file={config}",
         f"--storage.tsdb.path={base / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}",
         "--web.enable-lifecycle"],
        cwd=base, stdout=prometheus_output, stderr=subprocess.STDOUT, text=True,
    )
    running = Stack(f"http://127.0.0.1:{prometheus_port}", exporter_url, exporter, prometheus)
    try:
        wait_for("the exporter", lambda: answers(f"{exporter_url}/metrics"), 60, exporter)
        wait_for("prometheus ready", lambda: answers(f"{running.prometheus_url}/-/ready"), 60,
                 prometheus)
        yield running
    finally:
        prometheus_code = stop_process(prometheus)
        exporter_code = stop_process(exporter)
        exporter_output.close()
        prometheus_output.close()
        # serve() ends cleanly on SIGTERM (what `docker stop` sends).
        assert exporter_code == 0, exporter_log.read_text()[-4000:]
        assert prometheus_code == 0, prometheus_log.read_text()[-4000:]


def instant_value(stack: Stack, expr: str) -> float | None:
    status, body = stack.query(expr)
    assert status == 200, body
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_prometheus__scrapes_the_exporter__database_gauge_is_queryable(stack: Stack) -> None:
    value = wait_for(
        "toolfence_operations_active in Prometheus",
        lambda: instant_value(stack, 'toolfence_operations_active{state="queued"}') is not None,
        60, stack.prometheus,
    )
    assert value

    assert instant_value(stack, 'toolfence_operations_active{state="queued"}') == 1.0
    assert instant_value(stack, 'up{job="toolfence"}') == 1.0
    assert instant_value(stack, "toolfence_exporter_database_up") == 1.0
    # Every invariant has its series once the exporter's first invariant pass is done
    # (I2 is the scrape's own); the planted operation violates I4 and I5 only
    wait_for(
        "the first invariant pass's gauges in Prometheus",
        lambda: instant_value(stack, 'toolfence_invariant_violations{invariant="I7"}') is not None,
        60, stack.prometheus,
    )
    assert instant_value(stack, "toolfence_exporter_invariant_pass_age_seconds") is not None
    violations = {
        code: instant_value(stack, f'toolfence_invariant_violations{{invariant="{code}"}}')
        for code in ("I1", "I2", "I3", "I4", "I5", "I6", "I7")
    }
    assert violations == {"I1": 0, "I2": 0, "I3": 0, "I4": 1, "I5": 1, "I6": 0, "I7": 0}


def test_prometheus__planted_violation__its_invariant_alert_goes_pending(stack: Stack) -> None:
    def alerts() -> set[str] | None:
        status, body = http_json(f"{stack.prometheus_url}/api/v1/alerts")
        assert status == 200, body
        active = {a["labels"]["alertname"] for a in body["data"]["alerts"]
                  if a["labels"]["alertname"].startswith("ToolfenceInvariant")}
        return active or None

    # The rule's `for: 1m` keeps it pending first; pending or firing, it is the planted ones'
    active = wait_for("an invariant alert pending", alerts, 60, stack.prometheus)
    assert active == {"ToolfenceInvariantI4Violated", "ToolfenceInvariantI5Violated"}


def test_prometheus__scrapes_the_exporter__worker_counter_is_queryable(stack: Stack) -> None:
    wait_for(
        "toolfence_handler_invocations_total in Prometheus",
        lambda: instant_value(stack, "toolfence_handler_invocations_total") is not None,
        60, stack.prometheus,
    )

    assert instant_value(
        stack, 'toolfence_handler_invocations_total{tool="ledger.refund"}'
    ) == 3.0


def test_prometheus__loads_and_evaluates_every_alert_rule(stack: Stack) -> None:
    rules = yaml.safe_load((OPS / "alerts.yml").read_text(encoding="utf-8"))
    expected = {r["alert"] for group in rules["groups"] for r in group["rules"]}

    def evaluated() -> dict[str, str] | None:
        status, body = http_json(f"{stack.prometheus_url}/api/v1/rules")
        assert status == 200, body
        health = {
            rule["name"]: rule["health"]
            for group in body["data"]["groups"]
            for rule in group["rules"]
        }
        return health if set(health) == expected and "unknown" not in health.values() else None

    health = wait_for("every rule evaluated", evaluated, 60, stack.prometheus)

    assert health == dict.fromkeys(expected, "ok")


def test_prometheus__rejects_a_broken_expression(stack: Stack) -> None:
    # The parse check below can fail: Prometheus answers a syntax error with 400.
    status, body = stack.query("sum(rate(toolfence_retries_total[1m])")

    assert status == 400 and body["errorType"] == "bad_data", body


def grafana_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load((OPS / "alerts.yml").read_text(encoding="utf-8"))
    return [str(r["expr"]) for group in rules["groups"] for r in group["rules"]]


# Grafana's variables, replaced as Grafana would before sending the query.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$tool": ".*",
}


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    leftover = re.findall(r"\$\{?\w+", expr)
    assert not leftover, f"unknown dashboard variable(s) {leftover} in {expr}"
    return expr


@pytest.mark.parametrize(
    "expr", [pytest.param(e, id=f"dashboard-{i}") for i, e in enumerate(grafana_expressions())]
)
def test_prometheus__every_dashboard_expression_returns_a_series(stack: Stack, expr: str) -> None:
    # Every metric has a series (the exporter's gauges, and every worker metric the
    # child touched): a panel whose query returns nothing names a series, or a label
    # value, that toolfence does not export. A rate needs two scrapes: wait for them.
    def result() -> list[Any] | None:
        status, body = stack.query(substitute(expr))
        assert status == 200 and body["status"] == "success", f"{expr}\n{body}"
        return list(body["data"]["result"]) or None

    assert wait_for(f"a series for {expr}", result, 60, stack.prometheus)


@pytest.mark.parametrize(
    "expr",
    [pytest.param(e, id=f"dashboard-{i}") for i, e in enumerate(grafana_expressions())]
    + [pytest.param(e, id=f"alert-{i}") for i, e in enumerate(alert_expressions())],
)
def test_prometheus__parses_every_dashboard_and_alert_expression(stack: Stack, expr: str) -> None:
    status, body = stack.query(substitute(expr))

    # A PromQL syntax error is 400 bad_data; an empty result is fine.
    assert status == 200 and body["status"] == "success", f"{expr}\n{body}"
