"""A secret driven through every input a producer, a model and a tool can give:
arguments (values and keys), tool error messages, a downstream's error text, a
tool's output, the server context (request, conversation and turn ids), and the
arguments an approver would see. Real relay, workers, reconciler and exporter
subprocesses, and the real CLI. Then every log, result, metric, broker payload
and CLI output is searched for it: found nowhere a model or an operator log
would show it (the operation's own stored arguments and context hold it, which
is where it belongs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import canary_tools
import pytest
import redis
from canary_tools import CANARY
from fleetkit import wait_until

from executor.cli.fleet import Fleet, Member
from executor.core.types import ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.engine import make_engine
from outbox.producer import enqueue
from outbox.results import results, settled
from tests.netkit import free_port

pytestmark = pytest.mark.timeout(240)


def _call(call_id: str, tool: str, arguments: dict[str, object]) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool, arguments=json.dumps(arguments))


CALLS = [
    _call("c_raise", "test.leaky", {"mode": "raise", "secret": CANARY}),
    _call("c_terminal", "test.leaky", {"mode": "terminal", "secret": CANARY}),
    _call("c_retryable", "test.leaky", {"mode": "retryable", "secret": CANARY}),
    _call("c_downstream", "test.leaky", {"mode": "downstream", "secret": CANARY}),
    _call("c_echo", "test.leaky", {"mode": "echo", "secret": CANARY}),
    _call("c_key", "test.leaky", {"mode": "echo", "secret": "x", CANARY: 1}),
    _call("c_value", "test.leaky", {"mode": CANARY, "secret": "x"}),
    ProposedCall(call_id="c_parse", tool_name="test.leaky",
                 arguments='{"mode": "echo", "secret": "' + CANARY + '", "secret": "x"}'),
    _call("c_approval", "test.needs_approval", {"secret": CANARY, "amount_cents": 100}),
]


def _cli(env: dict[str, str], *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "executor.cli", *args], env={**os.environ, **env},
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout + run.stderr


# JSON lines at INFO: Celery's own lines about each task and the relay's per publish too.
LOG_SETTINGS = {
    "text": {},
    "json": {"TOOLFENCE_LOG_FORMAT": "json", "TOOLFENCE_LOG_LEVEL": "info"},
}


@pytest.mark.parametrize("log_format", sorted(LOG_SETTINGS))
def test_canary__secret_everywhere__nowhere_a_model_or_operator_log_shows_it(
    settings: Settings, fleet_env: dict[str, str], make_fleet: Callable[..., Fleet],
    ledger: object, tmp_path: Path, broker_url: str, log_format: str,
) -> None:
    env = {**fleet_env, "TOOLFENCE_TOOLS": "canary_tools:registry", **LOG_SETTINGS[log_format]}
    engine = make_engine(settings.database_url)
    context = ServerContext(
        principal="alice", tenant="acme", roles=frozenset({"member"}), request_id=f"req-{CANARY}",
        conversation_id=f"conv-{CANARY}", turn_id=f"turn-{CANARY}",
    )
    # Given every call enqueued by a producer, and only the relay running
    with engine.begin() as conn:
        handle = enqueue(conn, CALLS, context, canary_tools.registry)
    fleet = make_fleet(env=env, workers=1, reconcile_every=None)
    fleet.start_relay(0)
    client = redis.Redis.from_url(broker_url)
    queue = env["TOOLFENCE_QUEUE"]
    # Then what the relay put on the broker carries operation ids, never the secret
    payloads = wait_until(lambda: client.lrange(queue, 0, -1), timeout=30, what="published messages")
    assert payloads and all(CANARY.encode() not in p for p in payloads)

    # When the workers, the reconciler and the exporter run them all to a settled state
    fleet.start_worker(0)
    fleet.reconcile_every = 1.0
    fleet.start_reconciler()
    port = free_port()
    fleet._spawn("exporter", 0, ["metrics", "--port", str(port), "--host", "127.0.0.1"])
    fleet.wait_ready(60)
    statuses = wait_until(
        lambda: (s := results(engine, context)) and all(settled(x) for x in s) and s,
        timeout=90, what="every call settled", show=lambda: results(engine, context),
    )
    by_id = {s.call_id: s for s in statuses}
    assert by_id["c_approval"].status == "pending"
    assert {by_id[c].status for c in ("c_raise", "c_terminal", "c_retryable", "c_key", "c_value")} == {
        "failed_terminal"
    }
    assert by_id["c_echo"].status == "succeeded"
    time.sleep(1.5)  # a reconciler pass and the exporter's first scrape
    page = wait_until(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode(),
        timeout=30, what="the exporter's page",
    )

    # Then the secret is in none of what a model, an operator or a log is shown:
    seen: dict[str, str] = {
        # the model's view, on every surface's write-back, and the producer's handle
        "results": json.dumps([s.model_dump(mode="json") for s in statuses]),
        "handle": json.dumps([c.status.model_dump(mode="json") for c in handle.calls]),
        # the metrics, served and on disk
        "metrics page": page,
        "metrics files": "".join(
            p.read_bytes().decode("latin-1") for p in Path(env["PROMETHEUS_MULTIPROC_DIR"]).rglob("*")
            if p.is_file()
        ),
        # the operator's commands
        "cli results": _cli(env, "results", context.request_id, "--tenant", "acme"),
        "cli results --provider": _cli(env, "results", context.request_id, "--tenant", "acme",
                                       "--provider", "anthropic"),
        "cli approvals": _cli(env, "approvals"),
        "cli pending": _cli(env, "pending"),
        "cli reconcile": _cli(env, "reconcile"),
    }
    for status in statuses:
        if status.operation_id:
            seen[f"cli show {status.call_id}"] = _cli(env, "show", status.operation_id, "--tenant", "acme")
    fleet.stop(timeout=10)
    for member in fleet.members:
        seen[f"log {member.log_path.name}"] = member.log_path.read_text(errors="replace")
    leaks = [where for where, text in seen.items() if CANARY in text]
    assert leaks == [], {where: seen[where][max(0, seen[where].find(CANARY) - 200):][:400] for where in leaks}
    # And the secret did travel: it is in the operation's own stored arguments and
    # context, and where it would have shown, the sanitiser redacted it
    from sqlalchemy import text

    with engine.connect() as conn:
        stored = conn.execute(text(
            "SELECT arguments || context FROM toolfence_operations WHERE call_id = 'c_echo'"
        )).scalar_one()
    assert CANARY in stored
    assert "[REDACTED]" in seen["cli show c_echo"]  # the request id from the server context
    # And the tool's failures were logged, by code and operation id, for the operator,
    # their messages through the sanitiser
    worker_log = seen["log worker-0.log"]
    assert f"operation {by_id['c_raise'].operation_id}: tool test.leaky raised" in worker_log
    assert "RuntimeError: unexpected failure while handling [REDACTED]" in worker_log
    if log_format == "json":
        ran = [op for call in ("c_raise", "c_echo", "c_retryable") if (op := by_id[call].operation_id)]
        _check_json_logs(fleet, ran[0], ran)
    engine.dispose()


def _json_records(member: Member) -> list[dict[str, Any]]:
    """Every line of a member's log, each one JSON object with the standard fields."""
    records = []
    for line in member.log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"{member.log_path.name}: not a JSON line: {line[:300]!r}") from None
        assert isinstance(record, dict), line
        assert {"timestamp", "level", "logger", "message", "process", "thread"} <= record.keys(), record
        assert record["timestamp"].endswith("Z"), record
        records.append(record)
    assert records, f"{member.log_path.name} is empty"
    return records


def _check_json_logs(fleet: Fleet, raised_id: str, ran: list[str]) -> None:
    """JSON lines from every process (a prefork pool child's included), and the
    correlation ids on the lines about an operation."""
    logs = {member.log_path.name: _json_records(member) for member in fleet.members}
    worker = next(m for m in fleet.members if m.role == "worker")
    # The tool's failure, logged in the worker's pool child while it ran the operation:
    raised = [
        r for r in logs["worker-0.log"]
        if r.get("operation_id") == raised_id and "tool test.leaky raised" in r["message"]
    ]
    assert raised, logs["worker-0.log"]
    record = raised[0]
    assert record["process"] != worker.pid  # a pool child's line, JSON too
    assert record["tool"] == "test.leaky" and record["tenant"] == "acme" and record["call_id"] == "c_raise"
    assert isinstance(record["generation"], int) and record["generation"] >= 1
    # the producer's request id holds the canary: there, through the sanitiser
    assert record["request_id"] == "req-[REDACTED]"
    # Celery's own line about the task carries the operation id too
    assert any(
        r.get("operation_id") == raised_id and r["logger"].startswith("celery") for r in logs["worker-0.log"]
    ), logs["worker-0.log"]
    # Celery's own shutdown line is a record too, and the warm shutdown still exits 0
    assert any(r["message"] == "worker: Warm shutdown (MainProcess)" for r in logs["worker-0.log"])
    assert worker.process.returncode == 0
    # And the relay said what it published, each line with its operation's id
    published = {r["operation_id"] for r in logs["relay-0.log"] if r["message"].startswith("published ")}
    assert set(ran) <= published, (ran, published)
