"""`toolfence` as an operator runs it, in subprocesses, on PostgreSQL: `migrate`,
one-line errors, and a provider turn through a real fleet (`toolfence worker` and
`toolfence relay` on Redis), approval included.

A missing PostgreSQL or Redis fails loudly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic.types as anthropic_types
import pytest
from pydantic import TypeAdapter

from executor.providers import SURFACES, encode_tool_name
from executor.store.migrate import head_revision
from ledger.service import Ledger

pytestmark = pytest.mark.postgres

REDIS_URL = os.environ.get("TOOLFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN_DSN = os.environ.get("TOOLFENCE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
WHO = ["--tenant", "acme", "--principal", "alice"]
Toolfence = Callable[..., subprocess.CompletedProcess[str]]


def base_env(tmp_path: Path, database_url: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith("TOOLFENCE_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    return {
        **env, "TOOLFENCE_HOME": str(tmp_path / "home"), "TOOLFENCE_DATABASE_URL": database_url,
        # The reference downstream (imported from the checkout: these run in its directory).
        "TOOLFENCE_TOOLS": "ledger.tools:registry",
    }


def run_toolfence(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "executor.cli", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def toolfence(pg_url: str, tmp_path: Path) -> Toolfence:
    env = base_env(tmp_path, pg_url)

    def run(*args: str, timeout: float = 60, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return run_toolfence({**env, **extra_env}, *args, timeout=timeout)

    return run


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("toolfence: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ---------------------------------------------------------------- migrate and mistakes


def test_migrate__url_with_password__idempotent_and_the_password_never_printed(
    pg_url: str, tmp_path: Path
) -> None:
    secret_url = pg_url.replace("://postgres@", "://postgres:s3cret-pw@", 1)
    assert secret_url != pg_url  # trust authentication ignores the password
    env = base_env(tmp_path, secret_url)

    first, second = run_toolfence(env, "migrate"), run_toolfence(env, "migrate")

    masked = pg_url.replace("://postgres@", "://postgres:***@", 1)
    expected = f"schema at revision {head_revision(pg_url)} ({masked})\n"
    for result in (first, second):
        assert (result.returncode, result.stdout) == (0, expected), result.stderr
        assert "s3cret-pw" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("args", "env", "fragments"),
    [
        pytest.param(
            ["show", "op_x", "--tenant", "acme"],
            {"TOOLFENCE_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/toolfence"},
            ["cannot reach the database", "port 1"], id="unreachable-postgres",
        ),
        pytest.param(
            ["show", "op_x", "--tenant", "acme"],
            {"TOOLFENCE_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/no_such_db_for_toolfence"},
            ["cannot reach the database", "no_such_db_for_toolfence", "does not exist"],
            id="no-such-database",
        ),
        pytest.param(
            ["show", "op_x", "--tenant", "acme"], {"TOOLFENCE_DATABASE_URL": "mysql://x"}, ["'mysql'"],
            id="bad-scheme",
        ),
        pytest.param(
            ["show", "op_nope", "--tenant", "acme"], {}, ["no operation 'op_nope'"], id="unknown-operation"
        ),
        pytest.param(
            ["results", "req_nope", "--tenant", "acme"], {}, ["no request 'req_nope'"], id="unknown-request"
        ),
        pytest.param(
            ["approve", "apr_nope", "--approver-principal", "bob", "--approver-tenant", "acme"], {},
            ["no approval"], id="unknown-approval",
        ),
        pytest.param(
            ["relay", "--once"], {"TOOLFENCE_BROKER_URL": "redis://127.0.0.1:1/0"},
            ["cannot reach the broker"], id="unreachable-broker",
        ),
        pytest.param(
            ["show", "op_x", "--tenant", "acme"], {"TOOLFENCE_LEASE_SECONDS": "abc"}, ["not a number"],
            id="bad-setting",
        ),
    ],
)
def test_user_mistake__postgres__one_line_and_nonzero_exit(
    toolfence: Toolfence, args: list[str], env: dict[str, str], fragments: list[str]
) -> None:
    assert_one_line_error(toolfence(*args, **env), *fragments)


def test_user_mistake__fresh_postgres_database__asks_for_migrate(
    pg_url: str, tmp_path: Path
) -> None:
    import psycopg

    name = f"toolfence_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        empty_url = pg_url.rsplit("/", 1)[0] + f"/{name}"
        result = run_toolfence(base_env(tmp_path, empty_url), "approvals")
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    assert_one_line_error(result, "schema is at nothing", "run `toolfence migrate`")


# ---------------------------------------------------------------- a provider turn on a real fleet


def _require_redis() -> None:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=2):
            return
    except OSError as exc:  # pragma: no cover - CI starts it
        pytest.fail(f"Redis at 127.0.0.1:6379 is required and not reachable: {exc}")


@pytest.fixture
def fleet_env(pg_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    _require_redis()
    queue = f"tf-cli-{uuid.uuid4().hex[:10]}"
    yield {
        **base_env(tmp_path, pg_url),
        "TOOLFENCE_BROKER_URL": REDIS_URL,
        "TOOLFENCE_QUEUE": queue,  # a queue per test: no other test's worker takes ours
        "TOOLFENCE_LEASE_SECONDS": "5",
        "TOOLFENCE_RELAY_POLL_SECONDS": "0.05",
    }
    from kombu import Connection, Queue

    try:
        with Connection(REDIS_URL, connect_timeout=2) as conn:
            Queue(queue).bind(conn.default_channel).delete()
    except Exception:
        pass


@pytest.fixture
def fleet(fleet_env: dict[str, str], tmp_path: Path) -> Iterator[list[Path]]:
    """`toolfence worker` and `toolfence relay`, each in its own process group."""
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    commands = [
        ["worker", "--pool", "solo", "--name", f"tf-cli-{uuid.uuid4().hex[:6]}@%h"],
        ["relay"],
    ]
    for command in commands:
        log = tmp_path / f"{command[0]}.log"
        with log.open("wb") as sink:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "executor.cli", *command], env=fleet_env,
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            ))
        logs.append(log)
    yield logs
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(10)


@pytest.fixture
def ledger(pg_url: str) -> Iterator[Ledger]:
    book = Ledger(pg_url)
    book.create_schema()
    book.open_account("acc-1", "acme", 100_000)
    book.open_account("acc-2", "acme", 0)
    yield book
    book.engine.dispose()


def _tool_results(written: Any) -> list[tuple[str, Any, bool]]:
    """(tool_use_id, payload, is_error) per block, after checking the SDK accepts the turn."""
    [message] = written
    adapter = TypeAdapter(anthropic_types.MessageParam)
    validated = adapter.validate_python(message)
    assert [dict(block) for block in validated["content"]]  # walked while the adapter lives
    for block in message["content"]:
        TypeAdapter(anthropic_types.ToolResultBlockParam).validate_python(block)
    return [(b["tool_use_id"], json.loads(b["content"]), b["is_error"]) for b in message["content"]]


@pytest.mark.redis
def test_provider_turn__real_fleet__results_then_approval_then_the_transfer_result(
    fleet_env: dict[str, str], fleet: list[Path], ledger: Ledger, tmp_path: Path
) -> None:
    rule = SURFACES["anthropic"].name_rule
    message = anthropic_types.Message.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "text", "text": "Let me check and move the money."},
            {"type": "tool_use", "id": "toolu_read", "name": encode_tool_name("ledger.get_balance", rule),
             "input": {"account_id": "acc-1"}},
            {"type": "tool_use", "id": "toolu_move", "name": encode_tool_name("ledger.transfer", rule),
             "input": {"source_account": "acc-1", "target_account": "acc-2", "amount_cents": 60_000}},
            {"type": "tool_use", "id": "toolu_bad", "name": encode_tool_name("ledger.get_balance", rule),
             "input": {"account_id": "acc-1", "tenant": "globex"}},
        ],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }).to_dict()
    (tmp_path / "message.json").write_text(json.dumps(message))

    def toolfence(*args: str) -> subprocess.CompletedProcess[str]:
        result = run_toolfence(fleet_env, *args)
        logs = "\n".join(log.read_text(errors="replace")[-3000:] for log in fleet)
        assert result.returncode == 0, f"{args}: {result.stderr}\n--- fleet logs ---\n{logs}"
        return result

    toolfence("enqueue", str(tmp_path / "message.json"), *WHO, "--provider", "anthropic",
              "--request-id", "req-turn")
    first = toolfence("results", "req-turn", "--tenant", "acme", "--wait", "30", "--provider", "anthropic")

    answered = _tool_results(json.loads(first.stdout))
    codes = [(call_id, payload.get("error", {}).get("code"), err) for call_id, payload, err in answered]
    assert codes == [
        ("toolu_read", None, False),
        ("toolu_move", "approval_required", True),
        ("toolu_bad", "invalid_arguments", True),
    ]
    assert answered[0][1]["output"] == {"account_id": "acc-1", "balance_cents": 100_000}

    [pending] = json.loads(toolfence("approvals").stdout)
    assert pending["impact"]["amount_cents"] == 60_000
    toolfence(
        "approve", pending["approval_id"], "--approver-principal", "bob", "--approver-tenant", "acme",
        "--approver-role", "approver",
    )
    second = toolfence(
        "results", "req-turn", "--tenant", "acme", "--wait", "30", "--provider", "anthropic"
    )

    read, move, bad = _tool_results(json.loads(second.stdout))
    assert (move[0], move[2]) == ("toolu_move", False)
    assert move[1]["output"]["applied"] is True and move[1]["output"]["receipt"]
    # The same stored read, read again later: same observation, older by then.
    assert (read[0], read[1]["output"], read[1]["observed_at"]) == (
        answered[0][0], answered[0][1]["output"], answered[0][1]["observed_at"],
    )
    assert read[1]["age_seconds"] >= answered[0][1]["age_seconds"]
    assert bad[1]["error"]["code"] == "invalid_arguments"
    assert (ledger.balance("acc-1"), ledger.balance("acc-2")) == (40_000, 60_000)
    shown = json.loads(toolfence("show", pending["operation_id"], "--tenant", "acme").stdout)
    assert (shown["state"], shown["generation"]) == ("succeeded", 1)
    assert [r["receipt"] for r in shown["receipts"]] == [move[1]["output"]["receipt"]]
