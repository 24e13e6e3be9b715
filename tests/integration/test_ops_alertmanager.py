"""Alerts reach someone: an invariant violation planted in a test database is
scraped by the exporter, fires its rule in a real Prometheus, and reaches the
webhook of a real Alertmanager, configured from ops/alertmanager.yml.

Prometheus and Alertmanager are Debian's (`prometheus`, `prometheus-alertmanager`,
installed by scripts/ci-deps.sh). Missing, these tests fail: they never skip. Each
process listens on a free loopback port and is stopped however the test ends.
The shipped files are used as they are but for what a test cannot wait for: the
rules' `for:` (promtool's unit tests in ops/alerts_test.yml check those) and
Alertmanager's group waits, both cut to a second; the webhook's URL is the test's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from checkkit import make_run, plant_i1

from executor.store.engine import make_engine
from tests.netkit import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
WEBHOOK_PATH = "/toolfence"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: run scripts/ci-deps.sh "
            "(Debian packages `prometheus` and `prometheus-alertmanager`)"
        )
    return path


def test_amtool__check_config__accepts_alertmanager_yml() -> None:
    result = subprocess.run(
        [tool("amtool"), "check-config", "alertmanager.yml"],
        cwd=OPS, capture_output=True, text=True, timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# ----------------------------------------------------------------- the pieces


class Webhook:
    """A tiny HTTP receiver of Alertmanager's webhook JSON, on a thread of its own."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.paths: list[str] = []
        lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    received.paths.append(self.path)
                    received.payloads.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._lock = lock
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{WEBHOOK_PATH}"

    def alerts(self, status: str = "firing") -> list[dict[str, Any]]:
        with self._lock:
            return [a for p in self.payloads for a in p["alerts"] if a["status"] == status]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start(args: list[str], log: Path, stack: ExitStack, cwd: Path) -> subprocess.Popen[str]:
    """A process writing to `log`, stopped (SIGTERM, then SIGKILL) when `stack` closes."""
    output = stack.enter_context(log.open("w"))
    process = subprocess.Popen(args, cwd=cwd, stdout=output, stderr=subprocess.STDOUT, text=True)
    stack.callback(stop_process, process)
    return process


def wait_for(what: str, check: Callable[[], Any], timeout: float,
             processes: dict[str, tuple[subprocess.Popen[str], Path]]) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for name, (process, log) in processes.items():
            if process.poll() is not None:
                pytest.fail(f"{name} exited ({process.returncode}) while waiting for {what}:\n"
                            f"{log.read_text()[-3000:]}")
        try:
            last = check()
        except (OSError, urllib.error.URLError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(0.25)
    logs = "\n".join(f"--- {name}\n{log.read_text()[-2000:]}" for name, (_, log) in processes.items())
    pytest.fail(f"timed out after {timeout}s waiting for {what}: last {last!r}\n{logs}")


def answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


def alertmanager_config(webhook_url: str) -> dict[str, Any]:
    """ops/alertmanager.yml, its webhooks pointed at the test's and its waits cut."""
    config = yaml.safe_load((OPS / "alertmanager.yml").read_text(encoding="utf-8"))
    for receiver in config["receivers"]:
        for webhook in receiver["webhook_configs"]:
            webhook["url"] = webhook_url
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        route.update(group_wait="1s", group_interval="1s")
    return dict(config)


def fast_rules() -> dict[str, Any]:
    """ops/alerts.yml with every `for:` cut to a second."""
    rules = yaml.safe_load((OPS / "alerts.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    return dict(rules)


# ----------------------------------------------------------------- the test


def test_alertmanager__planted_i1_violation__its_alert_reaches_the_webhook(
    pg_url: str, tmp_path: Path
) -> None:
    # Given a real run on a PostgreSQL test database, and a second accepted effect
    # planted for one of its writes (I1), the way a bug would leave it
    engine = make_engine(pg_url)
    try:
        run = make_run(engine, pg_url)
        with engine.begin() as conn:
            violating = plant_i1(conn, run)
    finally:
        engine.dispose()
    prometheus_binary = tool("prometheus")
    alertmanager_binary = tool("prometheus-alertmanager")

    with ExitStack() as stack:
        # And a webhook, an Alertmanager sending to it, an exporter scraping the
        # database and a Prometheus scraping the exporter with our rules
        webhook = Webhook()
        stack.callback(webhook.close)

        am_port = free_port()
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump(alertmanager_config(webhook.url)))
        alertmanager = start([
            alertmanager_binary, f"--config.file={am_config}",
            f"--storage.path={tmp_path / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",  # no gossip port: one instance
        ], tmp_path / "alertmanager.log", stack, tmp_path)

        exporter_port = free_port()
        exporter = start([
            sys.executable, "-c",
            "import sys; from executor.telemetry.exporter import serve;"
            " from executor.settings import Settings;"
            " serve(Settings(database_url=sys.argv[1], broker_url='memory://'),"
            " int(sys.argv[2]), '127.0.0.1')",
            pg_url, str(exporter_port),
        ], tmp_path / "exporter.log", stack, ROOT)

        prometheus_port = free_port()
        rules = tmp_path / "alerts.yml"
        rules.write_text(yaml.safe_dump(fast_rules()))
        prometheus_config = tmp_path / "prometheus.yml"
        prometheus_config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]},
            ]},
            "scrape_configs": [{
                "job_name": "toolfence",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
            }],
        }))
        prometheus = start([
            prometheus_binary, f"--config.file={prometheus_config}",
            f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
            "--rules.alert.resend-delay=1s",
        ], tmp_path / "prometheus.log", stack, tmp_path)
        processes = {
            "alertmanager": (alertmanager, tmp_path / "alertmanager.log"),
            "exporter": (exporter, tmp_path / "exporter.log"),
            "prometheus": (prometheus, tmp_path / "prometheus.log"),
        }
        wait_for("alertmanager ready", lambda: answers(f"http://127.0.0.1:{am_port}/-/ready"),
                 30, processes)

        # When the violation is scraped and its rule fires
        def invariant_alerts() -> set[str] | None:
            names = {a["labels"]["alertname"] for a in webhook.alerts()
                     if a["labels"]["alertname"].startswith("ToolfenceInvariant")}
            return names if "ToolfenceInvariantI1Violated" in names else None

        received = wait_for("the I1 alert at the webhook", invariant_alerts, 45, processes)

        # Then the webhook received the I1 page, and only the invariant planted
        assert received == {"ToolfenceInvariantI1Violated"}
        (alert,) = {json.dumps(a, sort_keys=True) for a in webhook.alerts()
                    if a["labels"]["alertname"] == "ToolfenceInvariantI1Violated"
                    and a["startsAt"]}  # one alert, however often it was (re)sent
        fired = json.loads(alert)
        assert fired["labels"]["severity"] == "page"
        assert fired["labels"]["invariant"] == "I1"
        assert fired["annotations"]["description"].startswith("1 violation(s) of I1")
        assert "toolfence check" in fired["annotations"]["description"]
        assert set(webhook.paths) == {WEBHOOK_PATH}
        # (the planted operation is what `toolfence check` would name)
        assert violating == run.write


def test_alertmanager_config__test_copy_keeps_the_shipped_routes() -> None:
    # The end-to-end test changes only the URL and the waits: the routing it
    # exercises is the shipped one.
    shipped = yaml.safe_load((OPS / "alertmanager.yml").read_text(encoding="utf-8"))
    copy = alertmanager_config("http://127.0.0.1:1/x")

    assert copy["route"]["group_by"] == shipped["route"]["group_by"]
    assert [r["matchers"] for r in copy["route"]["routes"]] == [
        r["matchers"] for r in shipped["route"]["routes"]
    ]
    assert [r["name"] for r in copy["receivers"]] == [r["name"] for r in shipped["receivers"]]
