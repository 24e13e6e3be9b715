"""The real CLI, as a subprocess, on hostile input files: every failure is one
`toolfence: ...` line on stderr and a non-zero exit, never a traceback, and
object-form arguments with a repeated key are refused like text-form ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.strategies import nested

CANARY = "sk-cliCANARYcliCANARYcli0123456789"
WHO = ["--tenant", "acme", "--principal", "alice", "--role", "member"]
ROOT = Path(__file__).resolve().parents[2]


def _toolfence(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    env["TOOLFENCE_HOME"] = str(home)
    # The reference downstream, imported from the checkout (it is not installed).
    env["TOOLFENCE_TOOLS"] = "ledger.tools:registry"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "executor.cli.main", *args], env=env, capture_output=True, text=True,
        timeout=120, cwd=home,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("cli-hostile")
    migrated = _toolfence(home, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    return home


HOSTILE_FILES = [
    pytest.param(b"[" * 100_000, "too_deep", id="100k_open_brackets"),
    pytest.param(b"1" * 5_000, "not JSON", id="5000_digit_integer"),
    pytest.param(b'[{"call_id": "c", "tool_name": "t", "arguments": {"n": 1' + b"0" * 4_400 + b"}}]",
                 "not JSON", id="4400_digit_integer_in_a_call"),
    pytest.param(b"[" * 1_000 + b"]" * 1_000, "too_deep", id="1000_deep_lists"),
    pytest.param(json.dumps(nested(900)).encode(), "too_deep", id="900_deep_objects"),
    pytest.param(b'{"calls": [], "calls": []}', "duplicate_key", id="duplicate_top_level_key"),
    pytest.param(b'[{"call_id": "c1", "tool_name": "ledger.get_balance", "arguments": '
                 b'{"account_id": "acme-1", "account_id": "acme-2"}}]', "duplicate_key",
                 id="duplicate_key_in_object_arguments"),
    pytest.param(b'["\\ud800"]', "not UTF-8", id="escaped_lone_surrogate"),
    pytest.param(b"\xff\xfe[]", "not UTF-8", id="not_utf8"),
    pytest.param(b"[NaN]", "not JSON", id="nan"),
    pytest.param(b'[{"call_id": 5, "tool_name": [], "arguments": null}]', "call #0", id="wrong_types"),
    pytest.param(b"", "not JSON", id="empty_file"),
]


@pytest.mark.parametrize(("content", "fragment"), HOSTILE_FILES)
def test_cli_enqueue__hostile_file__one_line_and_nonzero_exit(
    home: Path, content: bytes, fragment: str
) -> None:
    # Given an input file a hostile (or broken) producer wrote
    path = home / "calls.json"
    path.write_bytes(content)
    # When the real CLI enqueues it
    run = _toolfence(home, "enqueue", str(path), *WHO, "--request-id", "req-hostile")
    # Then it answers one line naming the problem, and fails
    assert run.returncode != 0
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr[:2000]
    assert lines[0].startswith("toolfence: ")
    assert fragment in lines[0]
    assert "Traceback" not in run.stderr


def test_cli_enqueue__file_over_the_size_limit__one_line_and_nonzero_exit(home: Path) -> None:
    path = home / "huge.json"
    path.write_bytes(b"[" + b'"aaaaaaaaaaaaaaaa",' * (17 * 1024 * 1024 // 19) + b'"a"]')
    run = _toolfence(home, "enqueue", str(path), *WHO)
    assert run.returncode != 0
    assert run.stderr.splitlines() == [run.stderr.strip()] and "too_large" in run.stderr


def test_cli_enqueue__provider_envelope_with_duplicate_input_key__refused(home: Path) -> None:
    # Given an Anthropic message whose tool_use input repeats a key (the parser of
    # another component could keep the other copy)
    path = home / "message.json"
    path.write_bytes(
        b'{"role": "assistant", "stop_reason": "tool_use", "content": [{"type": "tool_use", '
        b'"id": "toolu_1", "name": "ledger__get_balance", "input": {"account_id": "acme-1", '
        b'"account_id": "' + CANARY.encode() + b'"}}]}'
    )
    run = _toolfence(home, "enqueue", str(path), "--provider", "anthropic", *WHO)
    assert run.returncode != 0
    assert "duplicate_key" in run.stderr and CANARY not in run.stderr + run.stdout


@pytest.mark.parametrize("bad", ["req\x1b[31m", "r" * 201])
def test_cli_enqueue__bad_request_id__one_line_naming_the_field(home: Path, bad: str) -> None:
    path = home / "ok.json"
    path.write_text(json.dumps([{"call_id": "c1", "tool_name": "ledger.get_balance",
                                 "arguments": {"account_id": "acme-1"}}]))
    run = _toolfence(home, "enqueue", str(path), *WHO, "--request-id", bad)
    assert run.returncode != 0
    assert run.stderr.startswith("toolfence: invalid_identifier: request_id")
    assert len(run.stderr.splitlines()) == 1 and bad not in run.stderr


def test_cli_enqueue__bad_call_id__terminal_result_printed_escaped(home: Path) -> None:
    # Given a call whose id carries a terminal escape and a NUL
    path = home / "escape.json"
    path.write_text(json.dumps([{"call_id": "c\x1b]0;pwned\x07\x00", "tool_name": "ledger.get_balance",
                                 "arguments": {"account_id": "acme-1"}}]))
    run = _toolfence(home, "enqueue", str(path), *WHO, "--request-id", "req-escape")
    # Then the call ends invalid_identifier, and the output carries no raw control character
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stdout and "\x00" not in run.stdout
    [call] = json.loads(run.stdout)["calls"]
    assert (call["status"], call["error"]["code"]) == ("failed_terminal", "invalid_identifier")
