"""The `toolfence` CLI in process: `--help` on every command, a user mistake as one
line on stderr with a non-zero exit, the operator's happy paths on the embedded
default (a SQLite file and the filesystem broker under TOOLFENCE_HOME), and the
provider path (`enqueue --provider` → execution → `results --provider`) on every
surface, its output validated against each official SDK's parameter types.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic.types as anthropic_types
import openai.types.chat as openai_chat_types
import openai.types.responses as openai_responses_types
import pytest
from google.genai import interactions as genai_interactions
from google.genai import types as genai_types
from pydantic import TypeAdapter
from sqlalchemy import func, select, text

from executor.cli.main import build_parser, main
from executor.core.tools import load_registry
from executor.providers import SURFACES, encode_tool_name
from executor.providers.gemini_generate import is_synthetic_call_id
from executor.settings import Settings
from executor.store import engine as store_engine
from executor.store import schema
from executor.store.migrate import head_revision
from executor.worker.runner import OperationRunner
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger
from outbox.relay import Relay
from tests.netkit import REFUSED_PASSWORD, Directory, refused_database_url

COMMANDS = [
    "migrate", "demo", "worker", "relay", "reconcile", "check", "metrics", "enqueue", "results",
    "show", "approvals", "approve", "deny", "pending", "resolve", "turn", "eval", "serve", "keys", "sandbox",
    "config", "completion",
]
WHO = ["--tenant", "acme", "--principal", "alice"]


def approver(principal: str, tenant: str = "acme", *roles: str) -> list[str]:
    """The CLI arguments naming who decides an approval."""
    argv = ["--approver-principal", principal, "--approver-tenant", tenant]
    for role in roles or ("approver",):
        argv += ["--approver-role", role]
    return argv


BOB, CAROL = approver("bob"), approver("carol")
BALANCE, CREDIT, TRANSFER, NOTICE = (
    "ledger.get_balance", "ledger.credit", "ledger.transfer", "ledger.send_notice",
)


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def home(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TOOLFENCE_HOME = tmp_path, nothing else configured: the embedded default.

    `sqlite_url` put a migrated copy exactly where the default database lives.
    """
    assert sqlite_url == f"sqlite:///{tmp_path / 'toolfence.db'}"
    for name in list(os.environ):
        if name.startswith("TOOLFENCE_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path))
    # The reference downstream: TOOLFENCE_TOOLS has no default.
    monkeypatch.setenv("TOOLFENCE_TOOLS", "ledger.tools:registry")
    monkeypatch.chdir(tmp_path)
    # Per-process caches: this test's engines and ledger client, not an earlier test's.
    engines: dict[str, Any] = {}
    monkeypatch.setattr(store_engine, "_engines", engines)
    monkeypatch.setattr(ledger_service, "_default", None)
    yield tmp_path
    for engine in engines.values():
        engine.dispose()
    if ledger_service._default is not None:
        ledger_service._default.engine.dispose()


@pytest.fixture
def ledger(home: Path) -> Iterator[Ledger]:
    book = Ledger(f"sqlite:///{home / 'toolfence.db'}")
    book.create_schema()
    book.open_account("acc-1", "acme", 100_000)
    book.open_account("acc-2", "acme", 0)
    book.open_account("other-1", "globex", 100_000)
    yield book
    book.engine.dispose()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    def run(*argv: str) -> Run:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def assert_one_line_error(run: Run, *fragments: str) -> None:
    assert run.code != 0, run
    assert "Traceback" not in run.err + run.out
    assert run.out == ""
    lines = run.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("toolfence: "), lines
    for fragment in fragments:
        assert fragment in lines[0]


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value), encoding="utf-8")
    return str(path)


def neutral(call_id: str, tool_name: str, arguments: Any) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool_name": tool_name,
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
    }


def transfer_of(amount_cents: int, call_id: str = "t1") -> dict[str, Any]:
    return neutral(
        call_id, TRANSFER,
        {"source_account": "acc-1", "target_account": "acc-2", "amount_cents": amount_cents},
    )


def enqueue_neutral(
    cli: Callable[..., Run], home: Path, request_id: str, calls: list[Any], who: list[str] = WHO
) -> Any:
    run = cli("enqueue", write_json(home / f"{request_id}.json", calls), *who, "--request-id", request_id)
    assert run.code == 0, run.err
    return run.json()


def execute_everything() -> list[str]:
    """What relay + workers do, in this process: publish, run, until nothing is left.

    Writes of a request are published one after another (each on its predecessor's
    completion), so the loop goes round until a pass publishes nothing.
    """
    settings = Settings.from_env()
    engine = store_engine.get_engine(settings.database_url)
    published: list[str] = []
    relay = Relay(settings, engine, published.append)
    runner = OperationRunner(settings, load_registry(settings.tools_module), engine)
    handled = 0
    while relay.run_once():
        for operation_id in published[handled:]:
            runner.handle(operation_id)
        handled = len(published)
    return published


# ---------------------------------------------------------------- --help


def test_help__commands_list__matches_the_parser() -> None:
    parser = build_parser()
    [subparsers] = [a for a in parser._actions if a.dest == "command"]
    assert sorted(subparsers.choices) == sorted(COMMANDS)


def test_help__top_level__names_each_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert out.startswith("usage: toolfence")
    for command in COMMANDS:
        assert command in out


@pytest.mark.parametrize("command", COMMANDS)
def test_help__every_command__exits_zero_and_names_it(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    captured = capsys.readouterr()
    assert exited.value.code == 0
    assert captured.out.startswith(f"usage: toolfence {command}")
    assert captured.err == ""


# ---------------------------------------------------------------- user mistakes: one line


@dataclass(frozen=True)
class Mistake:
    argv: list[str]
    expect: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


DUPLICATE_IDS = json.dumps(
    [neutral("same", BALANCE, {"account_id": "acc-1"}), neutral("same", BALANCE, {"account_id": "acc-2"})]
).encode()

MISTAKES = {
    "bad-database-url-scheme": Mistake(
        ["show", "op_x", "--tenant", "acme"], ["unsupported database URL scheme", "'mysql'"],
        env={"TOOLFENCE_DATABASE_URL": "mysql://x"},
    ),
    "unreachable-postgres": Mistake(
        ["show", "op_x", "--tenant", "acme"], ["cannot reach the database", "port 1"],
        env={"TOOLFENCE_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/toolfence"},
    ),
    "not-a-database-file": Mistake(
        ["show", "op_x", "--tenant", "acme"], ["database error", "not a database"],
        env={"TOOLFENCE_DATABASE_URL": "sqlite:///{home}/notes.db"}, files={"notes.db": b"x" * 200},
    ),
    "missing-migration": Mistake(
        ["show", "op_x", "--tenant", "acme"], ["no database at", "fresh.db", "run `toolfence migrate`"],
        env={"TOOLFENCE_DATABASE_URL": "sqlite:///{home}/fresh.db"},
    ),
    "missing-migration-empty-file": Mistake(
        ["approvals"], ["schema is at nothing", "run `toolfence migrate`"],
        env={"TOOLFENCE_DATABASE_URL": "sqlite:///{home}/empty.db"}, files={"empty.db": b""},
    ),
    "unwritable-home": Mistake(
        ["migrate"], ["/proc/no-such-dir"], env={"TOOLFENCE_HOME": "/proc/no-such-dir"},
    ),
    "non-numeric-setting": Mistake(
        ["show", "op_x", "--tenant", "acme"], ["TOOLFENCE_LEASE_SECONDS='abc' is not a number"],
        env={"TOOLFENCE_LEASE_SECONDS": "abc"},
    ),
    "unloadable-tools-module": Mistake(
        ["enqueue", "calls.json", *WHO], ["TOOLFENCE_TOOLS='no_such_module:registry'", "ModuleNotFound"],
        env={"TOOLFENCE_TOOLS": "no_such_module:registry"}, files={"calls.json": b"[]"},
    ),
    "tools-attribute-not-a-registry": Mistake(
        ["reconcile"], ["TOOLFENCE_TOOLS='ledger.tools:credit'", "not a toolfence Registry"],
        env={"TOOLFENCE_TOOLS": "ledger.tools:credit"},
    ),
    "unknown-operation-id": Mistake(["show", "op_nope", "--tenant", "acme"], ["no operation 'op_nope'"]),
    "unknown-request-id": Mistake(["results", "req_nope", "--tenant", "acme"], ["no request 'req_nope'"]),
    "unknown-approval-id-approve": Mistake(
        ["approve", "apr_nope", *BOB], ["no approval 'apr_nope'"]
    ),
    "unknown-approval-id-deny": Mistake(
        ["deny", "apr_nope", *BOB], ["no approval 'apr_nope'"]
    ),
    "resolve-unknown-operation": Mistake(
        ["resolve", "op_nope", "failed", "--tenant", "acme", "--principal", "ops"], ["no operation 'op_nope'"]
    ),
    "resolve-succeeded-without-reference": Mistake(
        ["resolve", "op_nope", "succeeded", "--tenant", "acme", "--principal", "ops"], ["needs --reference"]
    ),
    "bad-json-file": Mistake(
        ["enqueue", "calls.json", *WHO], ["calls.json is not JSON", "line 1"], files={"calls.json": b"[{"},
    ),
    "missing-file": Mistake(
        ["enqueue", "absent.json", *WHO], ["cannot read absent.json", "No such file"]
    ),
    "non-utf8-file": Mistake(
        ["enqueue", "calls.json", *WHO], ["calls.json is not UTF-8"], files={"calls.json": b"[\xff\xfe]"},
    ),
    "calls-file-not-a-list": Mistake(
        ["enqueue", "calls.json", *WHO], ['a list of calls or {"calls": [...]}'],
        files={"calls.json": b'{"call_id": "c1"}'},
    ),
    "call-missing-fields": Mistake(
        ["enqueue", "calls.json", *WHO], ["call #1 needs call_id, tool_name and arguments"],
        files={"calls.json": json.dumps([neutral("c1", BALANCE, "{}"), {"call_id": "c2"}]).encode()},
    ),
    "call-fields-of-wrong-type": Mistake(
        ["enqueue", "calls.json", *WHO], ["call #0", "must be strings"],
        files={"calls.json": b'[{"call_id": 7, "tool_name": "x", "arguments": []}]'},
    ),
    "duplicate-call-ids": Mistake(
        ["enqueue", "calls.json", *WHO], ["duplicate_call_id"], files={"calls.json": DUPLICATE_IDS},
    ),
    "unknown-provider-surface-enqueue": Mistake(
        ["enqueue", "calls.json", *WHO, "--provider", "openai"], ["unknown provider surface 'openai'"],
        files={"calls.json": b"{}"},
    ),
    "unknown-provider-surface-results": Mistake(
        ["results", "req_x", "--tenant", "acme", "--provider", "claude"],
        ["unknown provider surface 'claude'", "anthropic"],
    ),
    "provider-envelope-malformed": Mistake(
        ["enqueue", "msg.json", *WHO, "--provider", "anthropic"],
        ["msg.json (anthropic response)", "malformed_envelope"],
        files={"msg.json": b'{"id": "msg_1", "content": "not a list"}'},
    ),
    "provider-envelope-not-an-object": Mistake(
        ["enqueue", "msg.json", *WHO, "--provider", "openai-chat"],
        ["malformed_envelope", "JSON array, not an object"], files={"msg.json": b"[]"},
    ),
    "provider-envelope-duplicate-call-ids": Mistake(
        ["enqueue", "resp.json", *WHO, "--provider", "gemini-interactions"], ["duplicate_call_id"],
        files={"resp.json": json.dumps({"id": "int_1", "status": "requires_action", "steps": [
            {"type": "function_call", "id": "c1", "name": BALANCE, "arguments": {}},
            {"type": "function_call", "id": "c1", "name": BALANCE, "arguments": {}},
        ]}).encode()},
    ),
    "relay-once-unreachable-broker": Mistake(
        ["relay", "--once"], ["cannot reach the broker at redis://127.0.0.1:1/0"],
        env={"TOOLFENCE_BROKER_URL": "redis://127.0.0.1:1/0"},
    ),
    "relay-once-unknown-broker-transport": Mistake(
        ["relay", "--once"], ["cannot reach the broker", "No such transport: nosuch"],
        env={"TOOLFENCE_BROKER_URL": "nosuch://host/"},
    ),
}


@pytest.mark.parametrize("mistake", list(MISTAKES.values()), ids=list(MISTAKES))
def test_user_mistake__one_line_on_stderr_and_nonzero_exit(
    mistake: Mistake, home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, content in mistake.files.items():
        (home / name).write_bytes(content)
    for name, value in mistake.env.items():
        monkeypatch.setenv(name, value.format(home=home))

    run = cli(*mistake.argv)

    assert_one_line_error(run, *mistake.expect)


def test_user_mistake__rejected_batch__writes_nothing(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    (home / "calls.json").write_bytes(DUPLICATE_IDS)

    run = cli("enqueue", "calls.json", *WHO, "--request-id", "req-dup")

    assert_one_line_error(run, "duplicate_call_id")
    with store_engine.get_engine(Settings.from_env().database_url).connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.calls)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(schema.operations)).scalar_one() == 0
    assert_one_line_error(cli("results", "req-dup", "--tenant", "acme"), "no request 'req-dup'")


def test_user_mistake__approving_twice__second_is_one_line(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    handle = enqueue_neutral(cli, home, "req-big", [transfer_of(60_000)])
    approval_id = handle["calls"][0]["approval_id"]
    assert cli("approve", approval_id, *BOB).code == 0

    again = cli("approve", approval_id, *CAROL)
    deny_after = cli("deny", approval_id, *CAROL)

    assert_one_line_error(again, approval_id, "no longer pending")
    assert_one_line_error(deny_after, approval_id, "no longer pending")


def test_user_mistake__resolve_operation_not_reconciliation_pending__one_line(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    handle = enqueue_neutral(cli, home, "req-q", [neutral("c1", BALANCE, {"account_id": "acc-1"})])
    operation_id = handle["calls"][0]["operation_id"]

    run = cli("resolve", operation_id, "failed", "--tenant", "acme", "--principal", "ops")

    assert_one_line_error(run, operation_id, "is not reconciliation_pending")
    assert cli("show", operation_id, "--tenant", "acme").json()["state"] == "queued"


def test_user_mistake__verbose__adds_the_traceback_for_a_bug_report(
    home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLFENCE_TOOLS", "no_such_module:registry")
    (home / "calls.json").write_text("[]")

    run = cli("-v", "enqueue", "calls.json", *WHO)

    assert run.code != 0
    assert "Traceback" in run.err
    assert run.err.splitlines()[-1].startswith("toolfence: cannot load tools")


def test_user_mistake__argparse_usage_error__exit_2_without_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["resolve", "op_x", "maybe", "--tenant", "acme", "--principal", "ops"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "invalid choice: 'maybe'" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- happy paths, embedded default


def test_migrate__fresh_home__prints_revision_and_is_idempotent(
    home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = home / "fresh-home"
    monkeypatch.setenv("TOOLFENCE_HOME", str(fresh))
    url = f"sqlite:///{fresh / 'toolfence.db'}"
    assert_one_line_error(cli("show", "op_x", "--tenant", "acme"), "run `toolfence migrate`")
    assert not fresh.exists()  # asking created nothing

    first, second = cli("migrate"), cli("migrate")

    expected = f"schema at revision {head_revision(url)} ({url})\n"
    assert (first.code, first.out, first.err) == (0, expected, "")
    assert (second.code, second.out, second.err) == (0, expected, "")
    assert_one_line_error(cli("show", "op_x", "--tenant", "acme"), "no operation 'op_x'")


def test_enqueue__neutral_file__handle_with_operation_ids_and_pending_results(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    calls = [
        neutral("c1", BALANCE, {"account_id": "acc-1"}),
        neutral("c2", CREDIT, {"account_id": "acc-2", "amount_cents": 700}),
        neutral("c3", BALANCE, "{not json"),
    ]

    handle = enqueue_neutral(cli, home, "req-1", calls)

    assert handle["request_id"] == "req-1"
    assert [c["call_id"] for c in handle["calls"]] == ["c1", "c2", "c3"]
    first, second, rejected = handle["calls"]
    assert first["operation_id"].startswith("op_") and second["operation_id"].startswith("op_")
    assert first["operation_id"] != second["operation_id"]
    assert (first["status"], first["state"]) == ("pending", "queued")
    assert (second["status"], second["state"]) == ("pending", "queued")
    assert rejected["operation_id"] is None
    assert rejected["status"] == "failed_terminal"
    assert rejected["error"]["code"] == "invalid_arguments_json"

    results = cli("results", "req-1", "--tenant", "acme").json()

    assert [(r["call_id"], r["tool_name"], r["status"]) for r in results] == [
        ("c1", BALANCE, "pending"), ("c2", CREDIT, "pending"), ("c3", BALANCE, "failed_terminal"),
    ]
    assert [r["operation_id"] for r in results[:2]] == [first["operation_id"], second["operation_id"]]


def test_enqueue__same_file_twice__same_answers_and_nothing_new(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    calls = [
        neutral("c1", CREDIT, {"account_id": "acc-2", "amount_cents": 700}),
        neutral("c2", BALANCE, "{not json"),
    ]
    first = enqueue_neutral(cli, home, "req-twice", calls)

    second = enqueue_neutral(cli, home, "req-twice", calls)
    changed = enqueue_neutral(
        cli, home, "req-twice", [neutral("c1", CREDIT, {"account_id": "acc-2", "amount_cents": 9})]
    )

    assert second == first
    assert changed["calls"][0]["error"]["code"] == "idempotency_conflict"
    engine = store_engine.get_engine(Settings.from_env().database_url)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.operations)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(schema.calls)).scalar_one() == 2


def test_results__another_tenant__does_not_see_the_request(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    handle = enqueue_neutral(cli, home, "req-own", [neutral("c1", BALANCE, {"account_id": "acc-1"})])

    assert_one_line_error(cli("results", "req-own", "--tenant", "globex"), "no request 'req-own'")
    assert_one_line_error(
        cli("show", handle["calls"][0]["operation_id"], "--tenant", "globex"), "no operation"
    )


def test_enqueue__from_stdin__same_as_a_file(
    home: Path, ledger: Ledger, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"calls": [neutral("c1", BALANCE, {"account_id": "acc-1"})]}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(calls)))

    run = cli("enqueue", "-", *WHO, "--request-id", "req-stdin")

    assert run.code == 0, run.err
    assert run.json()["calls"][0]["state"] == "queued"


def test_enqueue__ledger_database_down__one_line_upstream_unavailable_and_nothing_recorded(
    home: Path, ledger: Ledger, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the ledger's database, which its access rule reads, refuses connections
    down = Ledger(refused_database_url("ledger"))
    monkeypatch.setattr(ledger_service, "_default", down)
    calls = [neutral("c1", BALANCE, {"account_id": "acc-1"})]
    path = write_json(home / "calls.json", calls)

    run = cli("enqueue", path, *WHO, "--request-id", "req-down")

    # Then one line says which tool could not decide and that nothing was recorded
    assert_one_line_error(run, "upstream_unavailable", "ledger.get_balance", "run it again")
    assert REFUSED_PASSWORD not in run.err and "127.0.0.1" not in run.err
    unknown = cli("results", "req-down", "--tenant", "acme")
    assert_one_line_error(unknown, "no request 'req-down'")
    # When the ledger answers again, the same command admits the call
    monkeypatch.setattr(ledger_service, "_default", ledger)
    again = cli("enqueue", path, *WHO, "--request-id", "req-down")
    assert again.code == 0, again.err
    assert again.json()["calls"][0]["state"] == "queued"
    down.engine.dispose()


def test_approve__role_directory_down__one_line_upstream_unavailable_and_still_pending(
    home: Path, ledger: Ledger, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    big = enqueue_neutral(cli, home, "req-big", [transfer_of(50_000)])
    approval_id = big["calls"][0]["approval_id"]
    # Given the application's role resolver asks a directory that refuses connections
    directory = Directory(up_url=pg_url, up=False)
    monkeypatch.setattr(ledger_tools.registry, "role_resolver", directory.roles)

    run = cli("approve", approval_id, *BOB)

    # Then one line says the check could not be made and the approval is still pending
    assert_one_line_error(run, "upstream_unavailable", "stays pending", approval_id)
    assert REFUSED_PASSWORD not in run.err
    assert [a["approval_id"] for a in cli("approvals").json()] == [approval_id]
    # When the directory answers, the same command approves it
    directory.up = True
    assert cli("approve", approval_id, *BOB).code == 0
    directory.dispose()


def test_approvals__big_transfer__listed_with_impact_then_approved_once_and_another_denied(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    small = enqueue_neutral(cli, home, "req-small", [transfer_of(49_999)])
    big = enqueue_neutral(cli, home, "req-big", [transfer_of(50_000)])
    other = enqueue_neutral(cli, home, "req-other", [transfer_of(75_000)])
    assert small["calls"][0]["state"] == "queued"  # below the threshold: no approval

    listed = cli("approvals").json()

    assert [a["operation_id"] for a in listed] == [
        big["calls"][0]["operation_id"], other["calls"][0]["operation_id"],
    ]
    assert all(a["tool"] == TRANSFER for a in listed)
    assert listed[0]["impact"] == {
        "summary": "move 500.00 from acc-1 to acc-2",
        "source_balance_cents": 100_000,
        "amount_cents": 50_000,
        "source_balance_after_cents": 50_000,
    }
    assert listed[0]["approval_id"] == big["calls"][0]["approval_id"]

    approved = cli("approve", listed[0]["approval_id"], *BOB)
    denied = cli("deny", listed[1]["approval_id"], *BOB, "--reason", "too much")

    assert (approved.code, approved.out) == (0, f"approved {listed[0]['approval_id']}\n")
    assert (denied.code, denied.out) == (0, f"denied {listed[1]['approval_id']}\n")
    assert cli("approvals").json() == []
    [big_result] = cli("results", "req-big", "--tenant", "acme").json()
    [other_result] = cli("results", "req-other", "--tenant", "acme").json()
    assert (big_result["status"], big_result["state"]) == ("pending", "queued")
    assert other_result["status"] == "failed_terminal"
    assert other_result["error"]["code"] == "approval_denied"


def test_approve__impact_changed_since_listed__refused_then_approved_on_the_new_figures(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    # Given two big transfers from one account, listed with their impacts as of now
    enqueue_neutral(cli, home, "req-a", [transfer_of(50_000)])
    enqueue_neutral(cli, home, "req-b", [transfer_of(60_000)])
    listed = cli("approvals").json()
    assert [card["impact_current"] for card in listed] == [True, True]
    first, second = listed
    # When the account's balance moves before the second card is decided
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE ledger_accounts SET balance_cents = 40000 WHERE account_id = 'acc-1'"))
    # Then approving on the digest that was shown is refused, and nothing is decided
    stale = cli("approve", second["approval_id"], *BOB, "--impact-digest", second["impact_digest"])
    assert_one_line_error(stale, "impact_changed", second["approval_id"])
    again = {card["approval_id"]: card for card in cli("approvals").json()}
    assert set(again) == {first["approval_id"], second["approval_id"]}
    fresh = again[second["approval_id"]]
    assert fresh["impact"]["source_balance_cents"] == 40_000
    assert fresh["impact_digest"] != second["impact_digest"]
    # And on the new digest it is approved (the execution-time rule still judges the funds)
    approved = cli("approve", second["approval_id"], *BOB, "--impact-digest", fresh["impact_digest"])
    assert approved.code == 0, approved


def test_approvals_and_pending__tenant_given__only_that_tenants_and_each_row_names_its_tenant(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    from executor import store

    ledger.open_account("other-2", "globex", 0)
    acme = enqueue_neutral(cli, home, "req-acme", [transfer_of(50_000)])
    gina = ["--tenant", "globex", "--principal", "gina"]
    globex = enqueue_neutral(cli, home, "req-globex", [neutral(
        "t1", TRANSFER,
        {"source_account": "other-1", "target_account": "other-2", "amount_cents": 60_000},
    )], who=gina)
    notices = {
        tenant: enqueue_neutral(
            cli, home, f"notice-{tenant}", [neutral("n1", NOTICE, {"account_id": account, "text": "hi"})],
            who=who,
        )["calls"][0]["operation_id"]
        for tenant, account, who in (("acme", "acc-1", WHO), ("globex", "other-1", gina))
    }
    engine = store_engine.get_engine(Settings.from_env().database_url)
    with engine.begin() as conn:
        # Each notice's worker took it and vanished: its lease is already over.
        for operation_id in notices.values():
            assert store.reserve(conn, operation_id, store.new_owner_token(), lease_seconds=-1.0)
    assert cli("reconcile").code == 0

    every = cli("approvals").json()
    only_globex = cli("approvals", "--tenant", "globex").json()
    pending_every = cli("pending").json()
    pending_acme = cli("pending", "--tenant", "acme").json()

    assert [(a["tenant"], a["operation_id"]) for a in every] == [
        ("acme", acme["calls"][0]["operation_id"]), ("globex", globex["calls"][0]["operation_id"]),
    ]
    assert [(a["tenant"], a["operation_id"]) for a in only_globex] == [
        ("globex", globex["calls"][0]["operation_id"]),
    ]
    assert sorted((p["tenant"], p["operation_id"]) for p in pending_every) == sorted(notices.items())
    assert [(p["tenant"], p["operation_id"]) for p in pending_acme] == [("acme", notices["acme"])]
    assert cli("approvals", "--tenant", "initech").json() == []
    assert cli("pending", "--tenant", "initech").json() == []


@pytest.mark.parametrize(
    ("verb", "who", "reason"),
    [
        pytest.param("approve", approver("alice"), "self_approval", id="requester-approves-own-call"),
        pytest.param("approve", approver("bob", "globex"), "other_tenant", id="other-tenants-approver"),
        pytest.param("approve", approver("carol", "acme", "member"), "role_not_allowed", id="wrong-role"),
        pytest.param("deny", approver("bob", "globex"), "other_tenant", id="other-tenant-denies"),
        pytest.param("deny", approver("carol", "acme", "member"), "role_not_allowed", id="wrong-role-denies"),
    ],
)
def test_approve_or_deny__approver_not_allowed__one_line_audited_and_still_pending(
    home: Path, ledger: Ledger, cli: Callable[..., Run], verb: str, who: list[str], reason: str
) -> None:
    # Given alice's transfer of 600.00, waiting for approval
    handle = enqueue_neutral(cli, home, "req-big", [transfer_of(60_000)])
    operation_id, approval_id = handle["calls"][0]["operation_id"], handle["calls"][0]["approval_id"]

    # When someone the ledger's approver policy does not allow decides it
    run = cli(verb, approval_id, *who)

    # Then one line names the stable code and why, the approval is still pending,
    # and the attempt is in the audit trail with who tried
    assert_one_line_error(run, "approver_not_allowed", reason, "stays pending")
    assert [a["approval_id"] for a in cli("approvals").json()] == [approval_id]
    shown = cli("show", operation_id, "--tenant", "acme").json()
    assert shown["state"] == "pending_approval"
    assert [(e["from"], e["to"], e["decision"], e["actor"]) for e in shown["audit"]][-1] == (
        "pending_approval", "pending_approval", "approver_not_allowed", who[1],
    )
    # ... and an allowed approver still can, afterwards, and the transfer runs
    assert cli("approve", approval_id, *BOB).code == 0
    execute_everything()
    [result] = cli("results", "req-big", "--tenant", "acme").json()
    assert result["status"] == "succeeded"
    assert (ledger.balance("acc-1"), ledger.balance("acc-2")) == (40_000, 60_000)


def test_deny__requester_withdraws_her_own_call__denied(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    handle = enqueue_neutral(cli, home, "req-big", [transfer_of(60_000)])

    run = cli("deny", handle["calls"][0]["approval_id"], *approver("alice", "acme", "member"))

    assert run.code == 0, run.err
    [result] = cli("results", "req-big", "--tenant", "acme").json()
    assert (result["status"], result["error"]["code"]) == ("failed_terminal", "approval_denied")


@pytest.mark.parametrize(
    "who",
    [
        pytest.param([], id="no-identity"),
        pytest.param(["--approver-principal", "bob"], id="no-tenant"),
        pytest.param(["--approver-context", "not json"], id="context-not-json"),
        pytest.param(["--approver-context", '{"principal": "bob"}'], id="context-without-tenant"),
    ],
)
def test_approve__approver_identity_missing_or_malformed__one_line_and_still_pending(
    home: Path, ledger: Ledger, cli: Callable[..., Run], who: list[str]
) -> None:
    handle = enqueue_neutral(cli, home, "req-big", [transfer_of(60_000)])
    approval_id = handle["calls"][0]["approval_id"]

    run = cli("approve", approval_id, *who)

    assert_one_line_error(run, "approver")
    assert [a["approval_id"] for a in cli("approvals").json()] == [approval_id]


def test_approve__approver_as_json_context__approved_and_recorded_as_decided_by(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    handle = enqueue_neutral(cli, home, "req-big", [transfer_of(60_000)])
    operation_id, approval_id = handle["calls"][0]["operation_id"], handle["calls"][0]["approval_id"]
    context = json.dumps({"principal": "dana", "tenant": "acme", "roles": ["approver"]})

    run = cli("approve", approval_id, "--approver-context", context)

    assert run.code == 0, run.err
    audit = cli("show", operation_id, "--tenant", "acme").json()["audit"]
    assert (audit[-1]["to"], audit[-1]["actor"]) == ("queued", "dana")


def test_show__approved_operation__state_generation_and_audit_trail(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    handle = enqueue_neutral(cli, home, "req-big", [transfer_of(60_000)])
    operation_id, approval_id = handle["calls"][0]["operation_id"], handle["calls"][0]["approval_id"]
    cli("approve", approval_id, *BOB)

    shown = cli("show", operation_id, "--tenant", "acme").json()

    assert shown["operation_id"] == operation_id
    assert (shown["request_id"], shown["call_id"], shown["tool"]) == ("req-big", "t1", TRANSFER)
    assert (shown["state"], shown["generation"], shown["attempts"]) == ("queued", 0, 0)
    assert shown["receipts"] == []
    trail = [(e["from"], e["to"], e["actor"]) for e in shown["audit"]]
    assert trail[-1] == ("pending_approval", "queued", "bob")
    assert trail[0][1] == "pending_approval"


def test_show__executed_write__succeeded_with_its_receipt_and_generation(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    handle = enqueue_neutral(
        cli, home, "req-credit", [neutral("c1", CREDIT, {"account_id": "acc-2", "amount_cents": 300})]
    )
    operation_id = handle["calls"][0]["operation_id"]
    execute_everything()

    shown = cli("show", operation_id, "--tenant", "acme").json()

    assert (shown["state"], shown["generation"], shown["error_code"]) == ("succeeded", 1, None)
    assert shown["receipt"] and shown["receipts"] == [
        {"receipt": shown["receipt"], "generation": 1, "accepted": True}
    ]
    assert [e["to"] for e in shown["audit"]][-2:] == ["started", "succeeded"]
    assert ledger.balance("acc-2") == 300


def test_pending__nothing_waits_for_a_person__empty_list(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    enqueue_neutral(cli, home, "req-1", [neutral("c1", BALANCE, {"account_id": "acc-1"})])

    run = cli("pending")

    assert (run.code, run.json(), run.err) == (0, [], "")


def test_pending_and_resolve__unknown_outcome_of_unsafe_write__listed_then_resolved_by_a_person(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    from executor import store

    handle = enqueue_neutral(
        cli, home, "req-notice", [neutral("n1", NOTICE, {"account_id": "acc-1", "text": "hello"})]
    )
    operation_id = handle["calls"][0]["operation_id"]
    engine = store_engine.get_engine(Settings.from_env().database_url)
    with engine.begin() as conn:
        # A worker took it and vanished: its lease is already over.
        assert store.reserve(conn, operation_id, store.new_owner_token(), lease_seconds=-1.0)

    swept = cli("reconcile")
    listed = cli("pending").json()
    resolved = cli(
        "resolve", operation_id, "succeeded", "--tenant", "acme", "--principal", "ops",
        "--reference", "ntc_manual",
    )

    assert swept.code == 0, swept.err
    assert [(p["operation_id"], p["tool"], p["call_id"]) for p in listed] == [(operation_id, NOTICE, "n1")]
    assert (resolved.code, resolved.out) == (0, f"resolved {operation_id} as succeeded\n")
    shown = cli("show", operation_id, "--tenant", "acme").json()
    assert (shown["state"], shown["receipt"]) == ("succeeded", "ntc_manual")
    assert shown["audit"][-1]["actor"] == "ops"
    assert cli("pending").json() == []
    assert_one_line_error(
        cli("resolve", operation_id, "failed", "--tenant", "acme", "--principal", "ops"),
        "is not reconciliation_pending",
    )


def test_relay_once__embedded_broker__publishes_each_queued_operation_once(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    enqueue_neutral(cli, home, "req-1", [
        neutral("c1", BALANCE, {"account_id": "acc-1"}),
        neutral("c2", BALANCE, {"account_id": "acc-2"}),
        neutral("c3", BALANCE, "{not json"),  # rejected: nothing to publish
    ])

    first, second = cli("relay", "--once"), cli("relay", "--once")

    assert (first.code, first.out, first.err) == (0, "published 2\n", "")
    assert (second.code, second.out, second.err) == (0, "published 0\n", "")
    messages = list((home / "broker" / "queue").iterdir())
    assert len(messages) == 2


# ---------------------------------------------------------------- provider round trip, every surface


@dataclass(frozen=True)
class WireCall:
    call_id: str | None
    name: str  # the wire name, as the model writes it
    arguments: Any  # text for OpenAI surfaces, an object for the others


@dataclass(frozen=True)
class WrittenResult:
    call_id: str | None
    name: str | None
    payload: Any
    is_error: bool | None


def validate_typed(annotation: Any, value: Any) -> Any:
    """Validate against an SDK parameter type. pydantic validates `Iterable` fields
    lazily, so the result is walked while the adapter (and its validators) lives."""
    adapter = TypeAdapter(annotation)

    def walk(item: Any) -> Any:
        if isinstance(item, Mapping):
            return {key: walk(inner) for key, inner in item.items()}
        if isinstance(item, list | tuple) or hasattr(item, "__next__"):
            return [walk(inner) for inner in item]
        return item

    return walk(adapter.validate_python(value))


def assert_keys_within(value: Mapping[str, Any], typed_dict: Any) -> None:
    declared = set(typed_dict.__required_keys__) | set(typed_dict.__optional_keys__)
    assert set(value) <= declared, set(value) - declared


def chat_response(calls: list[WireCall]) -> dict[str, Any]:
    return openai_chat_types.ChatCompletion.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000, "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ],
        }}],
    }).to_dict()


def chat_back(response: dict[str, Any], written: list[dict[str, Any]]) -> list[WrittenResult]:
    for message in written:
        validate_typed(openai_chat_types.ChatCompletionToolMessageParam, message)
        assert_keys_within(message, openai_chat_types.ChatCompletionToolMessageParam)
    # The follow-up turn as a whole is a message list the SDK accepts.
    validate_typed(
        list[openai_chat_types.ChatCompletionMessageParam], [response["choices"][0]["message"], *written]
    )
    return [WrittenResult(m["tool_call_id"], None, json.loads(m["content"]), None) for m in written]


def responses_response(calls: list[WireCall]) -> dict[str, Any]:
    return openai_responses_types.Response.model_validate({
        "id": "resp_1", "object": "response", "created_at": 1_700_000_000, "model": "gpt-test",
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "status": "completed",
        "output": [
            {"type": "function_call", "id": f"fc_{i}", "call_id": c.call_id, "name": c.name,
             "arguments": c.arguments, "status": "completed"}
            for i, c in enumerate(calls)
        ],
    }).to_dict()


def responses_back(response: dict[str, Any], written: list[dict[str, Any]]) -> list[WrittenResult]:
    validate_typed(openai_responses_types.ResponseInputParam, written)
    for item in written:
        assert item["type"] == "function_call_output"
        validate_typed(openai_responses_types.ResponseInputItemParam, item)
    return [WrittenResult(i["call_id"], None, json.loads(i["output"]), None) for i in written]


def anthropic_response(calls: list[WireCall], stop_reason: str = "tool_use") -> dict[str, Any]:
    return anthropic_types.Message.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [{"type": "text", "text": "Checking."}] + [
            {"type": "tool_use", "id": c.call_id, "name": c.name, "input": c.arguments} for c in calls
        ],
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }).to_dict()


def anthropic_back(response: dict[str, Any], written: list[dict[str, Any]]) -> list[WrittenResult]:
    [message] = written
    validate_typed(anthropic_types.MessageParam, message)
    assert set(message) == {"role", "content"}
    for block in message["content"]:
        validate_typed(anthropic_types.ToolResultBlockParam, block)
        assert_keys_within(block, anthropic_types.ToolResultBlockParam)
    return [
        WrittenResult(b["tool_use_id"], None, json.loads(b["content"]), b["is_error"])
        for b in message["content"]
    ]


def gemini_response(calls: list[WireCall]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": "Checking."}]
    for c in calls:
        function_call = {"name": c.name, "args": c.arguments}
        if c.call_id is not None:
            function_call["id"] = c.call_id
        parts.append({"functionCall": function_call})
    return genai_types.GenerateContentResponse.model_validate(
        {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]}
    ).model_dump(mode="json", exclude_none=True, by_alias=True)


def gemini_back(response: dict[str, Any], written: list[dict[str, Any]]) -> list[WrittenResult]:
    [content] = written
    genai_types.Content.model_validate(content)  # forbids unknown fields
    assert content["role"] == "user"
    back = []
    for part in content["parts"]:
        function_response = part["functionResponse"]
        body = function_response["response"]
        back.append(WrittenResult(
            function_response.get("id"), function_response["name"], body.get("output", body), "error" in body,
        ))
    return back


def interactions_response(calls: list[WireCall]) -> dict[str, Any]:
    return genai_interactions.Interaction.model_validate({
        "id": "int_1", "status": "requires_action",
        "steps": [{"type": "user_input", "content": [{"type": "text", "text": "Balance?"}]}] + [
            {"type": "function_call", "id": c.call_id, "name": c.name, "arguments": c.arguments}
            for c in calls
        ],
    }).model_dump(mode="json", exclude_none=True)


def interactions_back(response: dict[str, Any], written: list[dict[str, Any]]) -> list[WrittenResult]:
    # The next create call's `input` (the *Param TypedDicts cannot be built by pydantic).
    parsed = TypeAdapter(genai_interactions.InteractionsInput).validate_python(written)
    assert all(isinstance(step, genai_interactions.FunctionResultStep) for step in parsed)
    return [WrittenResult(s["call_id"], s["name"], json.loads(s["result"]), s["is_error"]) for s in written]


@dataclass(frozen=True)
class SurfaceCase:
    build: Callable[[list[WireCall]], dict[str, Any]]
    read_back: Callable[[dict[str, Any], list[dict[str, Any]]], list[WrittenResult]]
    text_arguments: bool
    # How this surface carries a call the gates must reject, and the code they give.
    rejected_arguments: Any
    rejected_code: str
    ids: tuple[str | None, str | None, str | None]


CASES = {
    "openai-chat": SurfaceCase(
        chat_response, chat_back, True, '{"account_id": "acc-1"', "invalid_arguments_json",
        ("call_Ab12", "call_Cd34", "call_Ef56"),
    ),
    "openai-responses": SurfaceCase(
        responses_response, responses_back, True, "{account_id: acc-1}", "invalid_arguments_json",
        ("call_r1", "call_r2", "call_r3"),
    ),
    # Anthropic's input is always an object: the schema gate rejects this one.
    "anthropic": SurfaceCase(
        anthropic_response, anthropic_back, False, {"account_id": "acc-1", "tenant": "globex"},
        "invalid_arguments",
        ("toolu_01A", "toolu_01B", "toolu_01C"),
    ),
    # Gemini's arguments are always an object: the schema gate rejects this one. The
    # credit comes without an id, as GenerateContent often sends calls.
    "gemini": SurfaceCase(
        gemini_response, gemini_back, False, {"account_id": "acc-1", "tenant": "globex"},
        "invalid_arguments", ("g-1", None, "g-3"),
    ),
    "gemini-interactions": SurfaceCase(
        interactions_response, interactions_back, False, {"account_id": "acc-1", "tenant": "globex"},
        "invalid_arguments", ("fc_1", "fc_2", "fc_3"),
    ),
}


def test_provider_cases__cover_every_surface() -> None:
    assert set(CASES) == set(SURFACES)


def test_enqueue__anthropic_response_cut_at_max_tokens__refused_whole_in_one_line(
    home: Path, cli: Callable[..., Run]
) -> None:
    # Given a response cut off by max_tokens while writing its last tool_use block
    response = anthropic_response([
        WireCall("toolu_01A", encode_tool_name(BALANCE, SURFACES["anthropic"].name_rule),
                 {"account_id": "acc-1"}),
    ], stop_reason="max_tokens")
    # When the CLI is asked to enqueue it
    run = cli(
        "enqueue", write_json(home / "response.json", response), *WHO,
        "--provider", "anthropic", "--request-id", "req-cut",
    )
    # Then nothing is admitted: one line names the stable code
    assert_one_line_error(run, "truncated_response")
    assert_one_line_error(cli("results", "req-cut", "--tenant", "acme"), "no request 'req-cut'")


@pytest.mark.parametrize("surface_name", list(CASES))
def test_provider_round_trip__enqueue_execute_results__one_sdk_valid_result_per_call_id(
    surface_name: str, home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    case, surface = CASES[surface_name], SURFACES[surface_name]
    wire_balance = encode_tool_name(BALANCE, surface.name_rule)
    wire_credit = encode_tool_name(CREDIT, surface.name_rule)
    if surface_name.startswith(("openai", "anthropic")):
        # "." is not allowed in these surfaces' function names: the name travels escaped.
        assert wire_balance != BALANCE and wire_credit != CREDIT

    def args(value: dict[str, Any]) -> Any:
        return json.dumps(value) if case.text_arguments else value

    response = case.build([
        WireCall(case.ids[0], wire_balance, args({"account_id": "acc-1"})),
        WireCall(case.ids[1], wire_credit, args({"account_id": "acc-2", "amount_cents": 250})),
        WireCall(case.ids[2], wire_balance, case.rejected_arguments),
    ])
    request_id = f"req-{surface_name}"

    enqueued = cli(
        "enqueue", write_json(home / "response.json", response), *WHO,
        "--provider", surface_name, "--request-id", request_id,
    )
    assert enqueued.code == 0, enqueued.err
    handle = enqueued.json()
    call_ids = [c["call_id"] for c in handle["calls"]]
    assert [c["tool_name"] for c in handle["calls"]] == [BALANCE, CREDIT, BALANCE]
    assert [c["status"] for c in handle["calls"]] == ["pending", "pending", "failed_terminal"]
    published = execute_everything()
    written = cli("results", request_id, "--tenant", "acme", "--provider", surface_name)

    assert written.code == 0, written.err
    assert sorted(published) == sorted(c["operation_id"] for c in handle["calls"][:2])
    back = case.read_back(response, written.json())
    assert [b.call_id for b in back] == list(case.ids)  # the model's own ids, exactly
    for given, enqueued_id in zip(case.ids, call_ids, strict=True):
        assert enqueued_id == given or (given is None and is_synthetic_call_id(enqueued_id))
    if back[0].name is not None:  # surfaces whose results carry the function's name
        assert [b.name for b in back] == [wire_balance, wire_credit, wire_balance]
    balance, credit, rejected = back
    assert balance.payload["output"] == {"account_id": "acc-1", "balance_cents": 100_000}
    assert credit.payload["output"]["applied"] is True and credit.payload["output"]["receipt"]
    for success in (balance, credit):  # freshness on the database clock, every surface
        assert success.payload["observed_at"].endswith("Z")
        assert 0 <= success.payload["age_seconds"] < 60
        assert success.payload["stale"] is False
    assert rejected.payload["error"]["code"] == case.rejected_code
    if back[0].is_error is not None:
        assert [b.is_error for b in back] == [False, False, True]
    assert ledger.balance("acc-2") == 250  # the write happened, once


def test_provider_results__before_execution__pending_calls_answered_with_why(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    wire_balance = encode_tool_name(BALANCE, SURFACES["anthropic"].name_rule)
    wire_transfer = encode_tool_name(TRANSFER, SURFACES["anthropic"].name_rule)
    response = anthropic_types.Message.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "tool_use", "id": "toolu_read", "name": wire_balance, "input": {"account_id": "acc-1"}},
            {"type": "tool_use", "id": "toolu_big", "name": wire_transfer, "input": {
                "source_account": "acc-1", "target_account": "acc-2", "amount_cents": 90_000,
            }},
        ],
        "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
    }).to_dict()
    cli("enqueue", write_json(home / "msg.json", response), *WHO, "--provider", "anthropic",
        "--request-id", "req-wait")

    written = cli("results", "req-wait", "--tenant", "acme", "--provider", "anthropic")

    assert written.code == 0, written.err
    back = anthropic_back(response, written.json())
    assert [(b.call_id, b.payload["error"]["code"], b.is_error) for b in back] == [
        ("toolu_read", "operation_in_progress", True),
        ("toolu_big", "approval_required", True),
    ]


# ---------------------------------------------------------------- hosted calls: never silent


def responses_with_mcp_call(mcp_tool: str, wire_balance: str) -> dict[str, Any]:
    """An OpenAI Responses output: one function call, and an `mcp_call` the provider ran."""
    return openai_responses_types.Response.model_validate({
        "id": "resp_h", "object": "response", "created_at": 1_700_000_000, "model": "gpt-test",
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "status": "completed",
        "output": [
            {"type": "mcp_call", "id": f"mcp_{mcp_tool}", "server_label": "crm", "name": mcp_tool,
             "arguments": '{"scope": "all"}', "output": "ssn 078-05-1120", "status": "completed"},
            {"type": "function_call", "id": "fc_0", "call_id": "call_bal", "name": wire_balance,
             "arguments": '{"account_id": "acc-1"}', "status": "completed"},
        ],
    }).to_dict()


def hosted_counter(outcome: str) -> float:
    from prometheus_client import REGISTRY as METRICS

    labels = {"surface": "openai-responses", "kind": "mcp_call", "outcome": outcome}
    return METRICS.get_sample_value("toolfence_hosted_calls_total", labels) or 0.0


def hosted_table(home: Path) -> list[Any]:
    engine = store_engine.get_engine(f"sqlite:///{home / 'toolfence.db'}")
    with engine.connect() as conn:
        return list(conn.execute(select(schema.hosted_calls)).all())


def test_enqueue_provider__mcp_call_the_policy_does_not_allow__results_report_it_failed_terminal(
    home: Path, ledger: Ledger, cli: Callable[..., Run]
) -> None:
    # Given no TOOLFENCE_HOSTED_POLICY (no hosted tool may run) and a response whose
    # provider ran delete_all on an MCP server
    wire_balance = encode_tool_name(BALANCE, SURFACES["openai-responses"].name_rule)
    response = responses_with_mcp_call("delete_all", wire_balance)
    before = hosted_counter("not_allowed")
    # When enqueued
    enqueued = cli("enqueue", write_json(home / "resp.json", response), *WHO,
                   "--provider", "openai-responses", "--request-id", "req-hosted")
    # Then the request answers the item, after the proposal, never `[]`
    assert enqueued.code == 0, enqueued.err
    assert [(c["call_id"], c["status"]) for c in enqueued.json()["calls"]] == [
        ("call_bal", "pending"), ("mcp_delete_all", "failed_terminal"),
    ]
    shown = cli("results", "req-hosted", "--tenant", "acme")
    assert shown.code == 0, shown.err
    reported = shown.json()[1]
    assert (reported["call_id"], reported["status"], reported["error"]["code"]) == (
        "mcp_delete_all", "failed_terminal", "hosted_call_not_allowed",
    )
    assert "crm" not in json.dumps(reported["error"]) and "delete_all" not in json.dumps(reported["error"])
    # ... every surface's results writer answers it too, SDK-valid
    written = cli("results", "req-hosted", "--tenant", "acme", "--provider", "openai-responses")
    assert written.code == 0, written.err
    back = responses_back(response, written.json())
    assert back[1].call_id == "mcp_delete_all"
    assert back[1].payload["error"]["code"] == "hosted_call_not_allowed"
    # ... and the table row exists, without the output; the counter moved
    [row] = hosted_table(home)
    assert (row.tool_name, row.allowed, row.code, row.call_id) == (
        "delete_all", False, "hosted_call_not_allowed", "mcp_delete_all",
    )
    assert "078-05-1120" not in repr(tuple(row))
    assert hosted_counter("not_allowed") == before + 1


def test_enqueue_provider__mcp_call_the_configured_policy_allows__recorded_allowed_no_result(
    home: Path, ledger: Ledger, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given TOOLFENCE_HOSTED_POLICY naming a policy that allows crm's lookup_customer
    (home / "hosted_policy_for_cli.py").write_text(
        "from executor import HostedPolicy, HostedServer\n"
        "POLICY = HostedPolicy(servers=(HostedServer(label='crm', url='https://crm.example/mcp',"
        " allowed_tools=frozenset({'lookup_customer'}), approval_required=frozenset()),),"
        " builtin_tools=frozenset())\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.setenv("TOOLFENCE_HOSTED_POLICY", "hosted_policy_for_cli:POLICY")
    wire_balance = encode_tool_name(BALANCE, SURFACES["openai-responses"].name_rule)
    before = hosted_counter("allowed")

    response = responses_with_mcp_call("lookup_customer", wire_balance)
    enqueued = cli("enqueue", write_json(home / "resp.json", response), *WHO,
                   "--provider", "openai-responses", "--request-id", "req-allowed")

    assert enqueued.code == 0, enqueued.err
    assert [c["call_id"] for c in cli("results", "req-allowed", "--tenant", "acme").json()] == ["call_bal"]
    [row] = hosted_table(home)
    assert (row.tool_name, row.allowed, row.call_id) == ("lookup_customer", True, None)
    assert hosted_counter("allowed") == before + 1


def test_enqueue_provider__hosted_policy_setting_not_a_policy__one_line(
    home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLFENCE_HOSTED_POLICY", "executor.settings:Settings")
    response = responses_with_mcp_call("delete_all", "x")

    run = cli("enqueue", write_json(home / "resp.json", response), *WHO, "--provider", "openai-responses")

    assert_one_line_error(run, "TOOLFENCE_HOSTED_POLICY", "not a HostedPolicy")
    assert hosted_table(home) == []


def test_worker__hosted_policy_that_does_not_load__refused_at_start_in_one_line(
    home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a policy the worker's turn jobs could never load: the worker says so at
    # start, as it does for tools, not in every turn job it would take
    monkeypatch.setenv("TOOLFENCE_HOSTED_POLICY", "no_such_policy_module:POLICY")

    run = cli("worker")

    assert_one_line_error(run, "TOOLFENCE_HOSTED_POLICY", "ModuleNotFoundError")


_INTERRUPTED_INSIDE_EXEC = """
import argparse, sys
import executor.cli.main as cli

def interrupted(args):
    # A Ctrl-C that lands in code built by exec of a string (as dataclasses and
    # SQLAlchemy build methods), caught by the command's own cleanup.
    try:
        exec("raise KeyboardInterrupt")
    except KeyboardInterrupt:
        return 130

class Parser:
    def __init__(self, *args, **kwargs):
        pass

    def parse_known_args(self, argv):
        return self.parse_args(argv), []

    def parse_args(self, argv):
        return argparse.Namespace(command="interrupted", func=interrupted, verbose=False)

cli.build_parser = Parser
sys.exit(cli.main([]))
"""


def test_main__interrupt_handled_inside_exec_code__exits_with_the_returned_status(tmp_path: Path) -> None:
    # Given a command that catches a Ctrl-C raised in exec-built code and returns 130
    (tmp_path / "interrupted_cli.py").write_text(_INTERRUPTED_INSIDE_EXEC, encoding="utf-8")
    # When it runs as `python -m` does (as the toolfence script does), SIGINT at its default
    result = subprocess.run(
        [sys.executable, "-m", "interrupted_cli"], cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Then the interpreter exits 130 as told, not killed by its own SIGINT at exit
    assert result.returncode == 130, (result.returncode, result.stderr)
