"""docker-compose.yml: valid against the Compose Specification's JSON schema, and
every toolfence service runs a subcommand the CLI actually has.

No Docker engine is needed: the schema is vendored under ops/schema/ (see its
README for source, version and license).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "ops" / "schema" / "compose-spec.json"

# Services built from the repository's Dockerfile, and what each must run.
EXPECTED_COMMANDS = {
    "migrate": ["toolfence", "migrate"],
    "relay": ["toolfence", "relay"],
    "worker": ["toolfence", "worker", "--concurrency", "2"],
    "reconciler": ["toolfence", "reconcile", "--every", "15"],
    "exporter": ["toolfence", "metrics", "--host", "0.0.0.0", "--port", "9464"],
    "serve": ["toolfence", "serve", "--host", "0.0.0.0", "--port", "8080"],
}


@cache
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def services() -> dict[str, dict[str, Any]]:
    return dict(compose()["services"])


def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    # The schema names draft 2019-09 as "http://…/schema#", a spelling jsonschema
    # does not map to a draft on its own.
    assert "2019-09" in schema["$schema"]
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


def test_compose__validates_against_the_compose_spec_schema() -> None:
    errors = sorted(validator().iter_errors(compose()), key=lambda e: list(e.absolute_path))

    assert not errors, "\n".join(f"{e.json_path}: {e.message}" for e in errors)


def test_compose_schema__rejects_an_unknown_depends_on_condition() -> None:
    # The validation above can fail: a broken file is caught.
    broken = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    broken["services"]["relay"]["depends_on"] = {"migrate": {"condition": "service_done"}}

    assert list(validator().iter_errors(broken))


def toolfence_commands() -> list[tuple[str, list[str]]]:
    return [
        (name, [str(part) for part in service["command"]])
        for name, service in services().items()
        if "build" in service
    ]


def test_compose__every_built_service_runs_the_expected_toolfence_command() -> None:
    assert dict(toolfence_commands()) == EXPECTED_COMMANDS


@cache
def cli_help(subcommand: str) -> subprocess.CompletedProcess[str]:
    # Exactly what the `toolfence` console script does: sys.exit(main()).
    return subprocess.run(
        [sys.executable, "-c", "import sys; from executor.cli.main import main; sys.exit(main())",
         subcommand, "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("service", sorted(EXPECTED_COMMANDS))
def test_compose__service_command__is_a_subcommand_the_cli_has(service: str) -> None:
    command = [str(part) for part in services()[service]["command"]]
    assert command[0] == "toolfence", f"{service} does not run toolfence: {command}"
    subcommand = command[1]

    result = cli_help(subcommand)

    assert result.returncode == 0, (
        f"docker-compose.yml service {service!r} runs `toolfence {subcommand}`, but "
        f"`toolfence {subcommand} --help` exited {result.returncode}: executor/cli/main.py lacks it "
        f"or fails to import.\n{result.stderr[-2000:]}"
    )
    # Every option the service passes is one the subcommand documents.
    for option in (part for part in command[2:] if part.startswith("--")):
        assert option in result.stdout, (
            f"`toolfence {subcommand}` has no option {option} (used by service {service!r})"
        )


def test_compose__worker_is_scalable() -> None:
    worker = services()["worker"]

    # A fixed name or host port would make `--scale worker=N` fail on the second replica.
    assert "container_name" not in worker
    assert "ports" not in worker


def test_compose__migrate_runs_once_before_every_toolfence_process() -> None:
    all_services = services()
    assert all_services["migrate"]["restart"] == "no"
    assert all_services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("relay", "worker", "reconciler", "exporter", "serve"):
        depends_on = all_services[name]["depends_on"]
        assert depends_on["migrate"]["condition"] == "service_completed_successfully", name


def test_compose__every_toolfence_process_exports_traces_to_the_jaeger_service() -> None:
    all_services = services()
    # The OTLP/HTTP endpoint every toolfence process inherits (executor/telemetry/tracing.py
    # turns traces on when it is set), a service of this file listening on 4318.
    for name in EXPECTED_COMMANDS:
        endpoint = all_services[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert endpoint == "http://jaeger:4318", name
    jaeger = all_services["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/jaeger:2.")
    assert jaeger["environment"]["JAEGER_LISTEN_HOST"] == "0.0.0.0"
    # Its UI on the host's loopback only; OTLP stays inside the compose network.
    assert jaeger["ports"] == ["127.0.0.1:16686:16686"]


def test_compose__redis_keeps_an_append_only_file() -> None:
    command = services()["redis"]["command"]

    assert command[command.index("--appendonly") + 1] == "yes"


def test_compose__the_exporter_sums_the_metrics_volume_every_process_writes() -> None:
    all_services = services()
    exporter = all_services["exporter"]
    root = exporter["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    assert f"metrics:{root}" in exporter["volumes"]
    for name in ("relay", "worker", "reconciler"):
        service = all_services[name]
        # Each container writes into <root>/<hostname> (ops/docker/entrypoint.sh).
        assert service["environment"]["TOOLFENCE_METRICS_ROOT"] == root, name
        assert "PROMETHEUS_MULTIPROC_DIR" not in service["environment"], name
        assert f"metrics:{root}" in service["volumes"], name


def test_compose__prometheus_and_grafana_mount_the_ops_files() -> None:
    all_services = services()
    prometheus_volumes = all_services["prometheus"]["volumes"]
    assert "./ops/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus_volumes
    assert "./ops/alerts.yml:/etc/prometheus/alerts.yml:ro" in prometheus_volumes
    for volume in [*prometheus_volumes, *all_services["grafana"]["volumes"]]:
        source = volume.split(":", 1)[0]
        if source.startswith("./"):
            assert (ROOT / source).exists(), f"{volume}: {source} does not exist"


def test_compose__exporter_target_matches_prometheus_config() -> None:
    config = yaml.safe_load((ROOT / "ops" / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "toolfence"]
    targets = [t for static in job["static_configs"] for t in static["targets"]]

    assert targets == ["exporter:9464"]
    exporter = services()["exporter"]
    # Prometheus scrapes across the compose network: the exporter listens on every
    # interface of its container (its own default is loopback), and the host sees it
    # on its loopback only.
    assert exporter["command"][exporter["command"].index("--host") + 1] == "0.0.0.0"
    assert exporter["ports"] == ["127.0.0.1:9464:9464"]


# ----------------------------------------------------------------- secrets (.env.example)

ENV_EXAMPLE = ROOT / ".env.example"
# `${NAME}`, `${NAME:-default}`, `${NAME:?message}`, …: Compose's interpolation.
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<form>[^}]*)\}")


def interpolations() -> list[tuple[str, str]]:
    """Every interpolation outside YAML comments (compose does not read those)."""
    lines = COMPOSE.read_text(encoding="utf-8").splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    return [(m["name"], m["form"]) for m in INTERPOLATION.finditer(text)]


def env_example() -> dict[str, str]:
    entries = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            entries[name.strip()] = value
    return entries


def test_compose__no_secret_has_a_default() -> None:
    text = COMPOSE.read_text(encoding="utf-8")

    assert "change-me" not in text
    assert "postgres:postgres@" not in text
    assert "POSTGRES_PASSWORD: postgres" not in text
    # Every variable is required: `:?` stops compose when it is unset or empty.
    assert interpolations(), "docker-compose.yml reads no secret from .env"
    for name, form in interpolations():
        assert form.startswith(":?"), f"${{{name}{form}}} has a default or may be empty"


def test_compose__the_secrets_it_reads__are_those_env_example_lists_empty() -> None:
    example = env_example()

    assert set(example) == {name for name, _ in interpolations()}
    assert set(example) >= {"POSTGRES_PASSWORD", "TOOLFENCE_HTTP_SESSION_SECRET", "GRAFANA_ADMIN_PASSWORD"}
    # No value is committed: a copied example must be filled in to start.
    assert all(value == "" for value in example.values()), example
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert ".env" in ignored


def test_compose__database_url_and_postgres_share_one_password() -> None:
    all_services = services()
    url = all_services["relay"]["environment"]["TOOLFENCE_DATABASE_URL"]
    password = all_services["postgres"]["environment"]["POSTGRES_PASSWORD"]

    assert url.startswith(f"postgresql+psycopg://postgres:{password}@postgres:5432/")


def test_compose__secret_checks_can_fail() -> None:
    # The interpolation parser sees a default where there is one.
    text = "X: ${A:-change-me} Y: ${B:?required}"
    found = [(m["name"], m["form"]) for m in INTERPOLATION.finditer(text)]

    assert found == [("A", ":-change-me"), ("B", ":?required")]


# ----------------------------------------------------------------- alertmanager


def test_compose__prometheus_sends_alerts_to_the_alertmanager_service() -> None:
    all_services = services()
    config = yaml.safe_load((ROOT / "ops" / "prometheus.yml").read_text(encoding="utf-8"))
    (alertmanagers,) = config["alerting"]["alertmanagers"]
    targets = [t for static in alertmanagers["static_configs"] for t in static["targets"]]

    assert targets == ["alertmanager:9093"]
    alertmanager = all_services["alertmanager"]
    assert "./ops/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro" in alertmanager["volumes"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in alertmanager["command"]
    # No authentication: the host reaches it on its loopback only.
    assert alertmanager["ports"] == ["127.0.0.1:9093:9093"]
    assert "alertmanager" in all_services["prometheus"]["depends_on"]


def test_alertmanager_config__every_alert_reaches_a_webhook() -> None:
    config = yaml.safe_load((ROOT / "ops" / "alertmanager.yml").read_text(encoding="utf-8"))
    receivers = {r["name"]: r for r in config["receivers"]}
    route = config["route"]
    routed = [route["receiver"], *(child["receiver"] for child in route.get("routes", []))]

    for name in routed:
        (webhook,) = receivers[name]["webhook_configs"]
        assert webhook["url"].startswith("http")
        assert webhook["send_resolved"] is True
    # One notification per rule and invariant: an I1 page is never folded into another.
    assert route["group_by"] == ["alertname", "invariant"]
