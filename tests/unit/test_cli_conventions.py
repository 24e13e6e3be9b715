"""The CLI's conventions (decision 0217, docs/fleet.md): what `--help`, `--version` and
completion load, help text on every option, one spelling per concept with the old
ones kept as hidden aliases, a scripted driver refused at start when it cannot be
read, why a turn fell back, `turn show --wait`, the exporter refusing to serve
without the fleet's counters, and times in ISO 8601 UTC.

The speed itself is a bench row (bench/cli_startup.py), not a timed assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from executor.cli.main import build_parser
from tests.unit.test_cli_turns import Run, cli, home, run_fleet_in_process  # noqa: F401 -- fixtures

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "celery", "kombu", "fastapi", "starlette", "uvicorn", "pydantic", "alembic",
         "jsonschema", "rich", "mcp", "httpx", "prometheus_client", "executor.store", "outbox")
WHO = ["--tenant", "acme", "--principal", "alice"]


def _subprocess(*code: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", "\n".join(code)], env={**os.environ, "PYTHONPATH": path}, cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )


def _loaded_after(argv: list[str]) -> list[str]:
    """The heavy modules a fresh interpreter has loaded once `toolfence argv` answered."""
    run = _subprocess(
        "import contextlib, io, json, sys",
        "from executor.cli.main import main",
        "with contextlib.redirect_stdout(io.StringIO()):",
        "    try:",
        f"        main({argv!r})",
        "    except SystemExit:",
        "        pass",
        "loaded = {m.split('.')[0] if not m.startswith('executor.') else m for m in sys.modules",
        f"          if m.startswith({HEAVY!r})}}",
        "print(json.dumps(sorted(loaded)))",
    )
    assert run.returncode == 0, run.stderr
    return list(json.loads(run.stdout.splitlines()[-1]))


def _parsers(
    parser: argparse.ArgumentParser, prog: str = "toolfence"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def _options(argv: list[str]) -> argparse.Namespace:
    return build_parser(every=True).parse_args(argv)


# ---------------------------------------------------------------- what --help loads


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"], ["completion", "bash"], ["turn", "start", "--help"], ["serve", "--help"]],
    ids=["help", "version", "completion", "turn-start-help", "serve-help"],
)
def test_startup__help_version_completion__load_no_heavy_module(argv: list[str]) -> None:
    # When toolfence answers --help, --version or completion in a fresh interpreter
    # Then none of SQLAlchemy, Celery, FastAPI, pydantic, the store, ... was imported
    assert _loaded_after(argv) == []


def test_startup__a_command_that_runs__loads_its_implementation() -> None:
    # The probe above can see a heavy import: `config` runs and loads the settings' values
    assert "pydantic" in _loaded_after(["config", "--json"])


def test_version__prints_the_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"toolfence {version('toolfence')}"


@pytest.mark.parametrize(
    "argv", [["--conf", "absent.toml", "show", "--help"], ["--config=absent.toml", "show", "--help"],
             ["-v", "--config", "show", "show", "--help"]],
)
def test_main__global_options_before_the_command__its_own_help(
    argv: list[str], capsys: pytest.CaptureFixture[str],
) -> None:
    from executor.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: toolfence show")


# ---------------------------------------------------------------- help text


def test_help__every_option_and_positional_of_every_command__has_help_text() -> None:
    missing = [
        f"{prog} {action.option_strings or action.dest}"
        for prog, parser in _parsers(build_parser(every=True))
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


@pytest.mark.parametrize("action", ["start", "show"])
def test_help__turn_start_and_show__have_descriptions(action: str) -> None:
    [(_, parser)] = [(p, s) for p, s in _parsers(build_parser(every=True)) if p == f"toolfence turn {action}"]
    assert parser.description and len(parser.description) > 80


# ---------------------------------------------------------------- completion


def test_completion__bash_script__completes_commands_and_options_without_hidden_aliases(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    from executor.cli.main import main

    assert main(["completion", "bash"]) == 0
    script = tmp_path / "toolfence.bash"
    script.write_text(capsys.readouterr().out)

    def complete(*words: str) -> set[str]:
        line = " ".join(["toolfence", *words])
        run = subprocess.run(
            ["bash", "-c", f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; '
             f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; _shtab_toolfence; '
             'printf "%s\\n" "${COMPREPLY[@]}"'],
            capture_output=True, text=True, timeout=60,
        )
        assert run.returncode == 0, run.stderr
        return {w.strip() for w in run.stdout.split()}

    assert {"resolve", "results"} <= complete("res")
    resolve = complete("resolve", "--")
    assert {"--tenant", "--principal", "--reference", "--note"} <= resolve
    assert "--actor" not in resolve
    assert "--approver-principal" not in complete("approve", "--")
    assert "--roles" not in complete("enqueue", "--")


@pytest.mark.parametrize(("shell", "marker"), [("zsh", "#compdef toolfence"), ("tcsh", "complete toolfence")])
def test_completion__zsh_and_tcsh__scripts_naming_every_command(
    shell: str, marker: str, capsys: pytest.CaptureFixture[str],
) -> None:
    from executor.cli.commands import COMMANDS, command_name
    from executor.cli.main import main

    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert marker in script
    assert all(command_name(module) in script for module in COMMANDS)


# ---------------------------------------------------------------- one spelling per concept

OLD_SPELLINGS = ("--roles", "--approver-principal", "--approver-tenant", "--approver-role", "--actor",
                 "--conversation")


def test_spelling__old_spellings__hidden_from_every_help() -> None:
    shown = {
        flag
        for _, parser in _parsers(build_parser(every=True))
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
    }
    assert shown.isdisjoint(OLD_SPELLINGS)


@pytest.mark.parametrize(
    ("command", "rest"),
    [(["enqueue", "calls.json"], []), (["turn", "start", "hi"], ["--conversation-id", "c"]),
     (["keys", "create"], ["--scope", "read"])],
    ids=["enqueue", "turn-start", "keys-create"],
)
def test_spelling__roles__repeated_comma_separated_or_the_old_list__the_same(
    command: list[str], rest: list[str]
) -> None:
    from executor.cli.args import roles_of

    def roles(*flags: str) -> frozenset[str]:
        args = _options([*command, *WHO, *rest, *flags])
        return roles_of(args) if hasattr(args, "role_default") else frozenset(args.role)

    if command[0] == "keys":
        # keys create keeps its list as given (split when the key is made)
        given = _options([*command, *WHO, *rest, "--roles", "a,b"]).role
        assert given == ["a,b"] == _options([*command, *WHO, *rest, "--role", "a,b"]).role
        return
    assert roles("--role", "a", "--role", "b") == roles("--role", "a,b") == {"a", "b"}
    assert roles("--roles", "a,b") == {"a", "b"}
    assert roles() == {"member"}


@pytest.mark.parametrize("command", [["enqueue", "calls.json", *WHO], ["turn", "start", "hi", *WHO]])
def test_spelling__conversation_id__old_conversation_is_an_alias(command: list[str]) -> None:
    assert _options([*command, "--conversation", "c-1"]).conversation_id == "c-1"
    assert _options([*command, "--conversation-id", "c-1"]).conversation_id == "c-1"


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_spelling__who_decides__principal_tenant_role_or_the_old_approver_flags(verb: str) -> None:
    new = _options([verb, "apr_1", "--principal", "bob", "--tenant", "acme", "--role", "approver"])
    old = _options([verb, "apr_1", "--approver-principal", "bob", "--approver-tenant", "acme",
                    "--approver-role", "approver"])
    assert (new.principal, new.tenant, new.role) == (old.principal, old.tenant, old.role) == (
        "bob", "acme", ["approver"])


def test_spelling__resolve__principal_or_the_old_actor_and_the_operations_tenant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from executor.cli.main import main

    base = ["resolve", "op_1", "failed", "--tenant", "acme"]
    assert _options([*base, "--actor", "ops"]).principal == _options([*base, "--principal", "ops"]).principal
    # Neither spelling given: the usage error argparse gives for a missing option
    assert main(base) == 2
    assert capsys.readouterr().err.strip() == (
        "toolfence resolve: error: the following arguments are required: --principal"
    )
    # And --tenant is required, as for `show`
    with pytest.raises(SystemExit) as exited:
        _options(["resolve", "op_1", "failed", "--principal", "ops"])
    assert exited.value.code == 2


def test_spelling__tenant__required_where_one_subject_is_named() -> None:
    """`--tenant` names the subject's tenant wherever one operation, request or turn is
    named (another tenant's is unknown); on a list it narrows the list."""
    subject_commands = {"show", "resolve", "results", "turn show"}
    for prog, parser in _parsers(build_parser(every=True)):
        name = prog.removeprefix("toolfence ")
        tenant = [a for a in parser._actions if "--tenant" in a.option_strings]
        if name in subject_commands:
            assert tenant and tenant[0].required, prog


# ---------------------------------------------------------------- turns


def test_turn_start__unreadable_script__refused_at_start_in_one_line_and_nothing_written(
    home: Path, cli: Callable[..., Run],  # noqa: F811 -- fixtures
) -> None:
    for driver, fragment in (("scripted:/nonexistent.jsonl", "No such file"),
                             (f"scripted:{home}", "not a regular file")):
        run = cli("turn", "start", *WHO, "--conversation-id", "c-1", "--driver", driver, "hi")
        assert run.code == 2 and run.out == "", run
        [line] = run.err.splitlines()
        assert line.startswith("toolfence: --driver") and fragment in line
    # Nothing was started: the user has no running turn to be refused behind
    (home / "ok.jsonl").write_text('{"final": "hi"}\n')
    ok = cli("turn", "start", *WHO, "--conversation-id", "c-1", "--driver", "scripted:ok.jsonl", "hi")
    assert ok.code == 0, ok.err


def test_turn_show__driver_failed__says_why_and_wait_returns_once_it_ended(
    home: Path, cli: Callable[..., Run],  # noqa: F811 -- fixtures
) -> None:
    # Given a turn whose script disappears before a worker reads it
    script = home / "gone.jsonl"
    script.write_text('{"final": "hi"}\n')
    turn_id = cli("turn", "start", *WHO, "--conversation-id", "c-1", "--driver", f"scripted:{script}",
                  "hi").out.strip()
    # When it is shown before a worker ran it, --wait 0.3 gives up and shows it running
    running = cli("turn", "show", turn_id, "--tenant", "acme", "--wait", "0.3")
    assert running.code == 0 and "state running" in running.out.splitlines()[0]
    script.unlink()
    run_fleet_in_process(turn_id)
    # Then --wait answers at once with the end, and the person reads why it fell back
    shown = cli("turn", "show", turn_id, "--tenant", "acme", "--wait", "30")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    # (a missing script is permanent: `failed`, not `fallback`, with the same reason)
    assert "state failed  (driver_failed)" in lines[0]
    [why] = [line for line in lines if line.startswith("  why: ")]
    assert "gone.jsonl" in why or "No such file" in why, why
    # And --json carries its times in ISO 8601 UTC
    view = json.loads(cli("turn", "show", turn_id, "--tenant", "acme", "--json").out)
    assert view["created_at"].endswith("Z")
    assert datetime.fromisoformat(view["finished_at"]).utcoffset() is not None


# ---------------------------------------------------------------- metrics


def test_metrics__no_multiprocess_directory__refused_in_one_line(
    home: Path, cli: Callable[..., Run],  # noqa: F811 -- fixtures
) -> None:
    run = cli("metrics", "--port", "0")
    assert run.code == 2 and run.out == ""
    [line] = run.err.splitlines()
    assert "PROMETHEUS_MULTIPROC_DIR is not set" in line and "--database-only" in line


# ---------------------------------------------------------------- times


def _is_iso_utc(value: object) -> bool:
    if not isinstance(value, str) or not value.endswith("Z"):
        return False
    return datetime.fromisoformat(value).utcoffset() is not None


def test_times__approvals_show_and_keys_list__iso_8601_utc(
    home: Path, cli: Callable[..., Run],  # noqa: F811 -- fixtures
) -> None:
    # Given a read and a transfer waiting for approval, and an API key
    calls = [{"call_id": "b1", "tool_name": "ledger.get_balance", "arguments": '{"account_id": "acc-1"}'},
             {"call_id": "t1", "tool_name": "ledger.transfer", "arguments": json.dumps(
                 {"source_account": "acc-1", "target_account": "acc-2", "amount_cents": 60_000})}]
    (home / "calls.json").write_text(json.dumps(calls))
    enqueued = cli("enqueue", "calls.json", *WHO, "--request-id", "r-1")
    assert enqueued.code == 0, enqueued.err
    assert cli("keys", "create", *WHO, "--scope", "read").code == 0
    # When an operator lists approvals and keys and shows the operation
    [card] = json.loads(cli("approvals").out)
    shown = json.loads(cli("show", card["operation_id"], "--tenant", "acme").out)
    [key] = json.loads(cli("keys", "list").out)
    # Then every time is ISO 8601 in UTC, never epoch seconds
    assert _is_iso_utc(card["expires_at"])
    assert shown["audit"] and all(_is_iso_utc(event["at"]) for event in shown["audit"])
    assert _is_iso_utc(key["created_at"]) and key["revoked_at"] is None
    # And once the read has run, its result's freshness time is ISO 8601 UTC too
    execute_in_process()
    [read, _] = json.loads(cli("results", "r-1", "--tenant", "acme").out)
    assert read["status"] == "succeeded" and _is_iso_utc(read["observed_at"])


def execute_in_process() -> None:
    """What the relay and a worker do, in this process, until nothing is left."""
    from executor.core.tools import load_registry
    from executor.settings import Settings
    from executor.store import engine as store_engine
    from executor.worker.runner import OperationRunner
    from outbox.relay import Relay

    settings = Settings.from_env()
    engine = store_engine.get_engine(settings.database_url)
    published: list[str] = []
    relay = Relay(settings, engine, published.append)
    runner = OperationRunner(settings, load_registry(settings.tools_module), engine)
    while relay.run_once():
        for operation_id in published:
            runner.handle(operation_id)
        published.clear()
