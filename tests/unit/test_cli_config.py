"""Settings in one place: every `TOOLFENCE_*` variable declared once
(executor/settings/variables.py) and read nowhere else, checked before a command
runs (a bad value: one line naming it, exit 2), and listed by `toolfence config`
with its source and secrets masked."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from executor import settings
from executor.cli.commands import worker
from executor.cli.main import build_parser, main
from executor.settings import DECLARED, VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("executor", "outbox", "reconciler")
SETTINGS_PACKAGE = ROOT / "executor" / "settings"
NAME = re.compile(r"\bTOOLFENCE_[A-Z0-9_]*")
READERS = {"get", "getenv", "pop", "setdefault"}


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith("TOOLFENCE_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


# ------------------------------------------------------------------ declared once, read once


def test_every_name_in_the_sources_is_declared() -> None:
    declared = set(VARIABLES)
    undeclared = set()
    for path in sources():
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            # A prefix in prose (TOOLFENCE_BUDGET_*, TOOLFENCE_EXPORTER_) names a family.
            known = any(d.startswith(name) for d in declared) if name.endswith("_") else name in declared
            if not known:
                undeclared.add(f"{path.relative_to(ROOT)}: {name}")
    assert not undeclared, sorted(undeclared)


def test_each_variable_is_declared_once_with_help() -> None:
    names = [v.name for v in DECLARED]
    assert len(names) == len(set(names))
    assert all(v.help for v in DECLARED)
    assert [v.name for v in DECLARED if v.secret] == ["TOOLFENCE_HTTP_SESSION_SECRET"]


def _environment_reads(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Reads (and writes) of the environment that name a TOOLFENCE_* variable, or
    read os.environ / os.getenv with a name computed at run time."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            first = node.args[0]
            if node.func.attr in READERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                if first.value.startswith("TOOLFENCE_"):
                    yield node.lineno, ast.unparse(node)
            elif node.func.attr in ("get", "getenv") and not isinstance(first, ast.Constant):
                target = ast.unparse(node.func.value)
                if target in ("os.environ", "environ", "os"):
                    yield node.lineno, ast.unparse(node)
        if (
            isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str) and node.slice.value.startswith("TOOLFENCE_")
            and "environ" in ast.unparse(node.value)
        ):
            yield node.lineno, ast.unparse(node)


def test_no_environment_read_of_a_setting_outside_the_settings_package() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for path in sources() if SETTINGS_PACKAGE not in path.parents
        for line, code in _environment_reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, found


def test_the_read_check_sees_each_way_of_reading() -> None:
    # The check above is only as good as what it recognises: each of these is one.
    reads = [
        'os.environ.get("TOOLFENCE_X")', 'os.getenv("TOOLFENCE_X", "1")', 'os.environ["TOOLFENCE_X"]',
        'os.environ.setdefault("TOOLFENCE_X", "5")', "os.environ.get(name)", 'source.get("TOOLFENCE_X", "")',
    ]
    for code in reads:
        assert list(_environment_reads(ast.parse(code))), code
    assert not list(_environment_reads(ast.parse('os.environ.get("PATH"); source[name]')))


# ------------------------------------------------------------------ toolfence config


def test_config__sources_and_masked_secrets(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., tuple[int, str, str]]
) -> None:
    # Given a settings file and an environment that overrides one of its values
    config = clean_env / "toolfence.toml"
    config.write_text(
        'queue = "from-file"\nlease_seconds = 7\nbroker_url = "redis://:brokerpw@cache:6379/0"\n'
        'budget_tenants = {acme = {request_max_calls = 2}}\nfault_points = ["a=kill", "b=kill"]\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("TOOLFENCE_QUEUE", "from-env")
    monkeypatch.setenv("TOOLFENCE_HTTP_SESSION_SECRET", "s3cret-session-value")
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", "postgresql+psycopg://app:dbpassw0rd@db:5432/tf")

    # When `toolfence --config FILE config --json` lists them
    code, out, err = cli("--config", str(config), "config", "--json")

    # Then each value says where it came from, and no secret is shown
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert set(rows) == set(VARIABLES)
    def said(name: str) -> tuple[str, str]:
        return rows[name]["value"], rows[name]["source"]

    assert said("TOOLFENCE_QUEUE") == ("from-env", "env")
    assert said("TOOLFENCE_LEASE_SECONDS") == ("7.0", "file")
    assert said("TOOLFENCE_CONFIG") == (str(config), "--config")
    assert rows["TOOLFENCE_FAULT_POINTS"]["value"] == "a=kill,b=kill"
    assert json.loads(rows["TOOLFENCE_BUDGET_TENANTS"]["value"]) == {"acme": {"request_max_calls": 2}}
    assert rows["TOOLFENCE_RELAY_BATCH_SIZE"]["source"] == "default"
    assert rows["TOOLFENCE_HTTP_SESSION_SECRET"]["value"] == "***"
    assert rows["TOOLFENCE_DATABASE_URL"]["value"] == "postgresql+psycopg://app:***@db:5432/tf"
    assert rows["TOOLFENCE_BROKER_URL"]["value"] == "redis://:***@cache:6379/0"
    for secret in ("s3cret-session-value", "dbpassw0rd", "brokerpw"):
        assert secret not in out

    # And the table form says the same, the file first
    code, out, _ = cli("--config", str(config), "config")
    assert code == 0
    assert out.splitlines()[0] == f"# settings file: {config}"
    assert re.search(r"^TOOLFENCE_LEASE_SECONDS\s+file\s+7\.0$", out, re.M)
    assert re.search(r"^TOOLFENCE_HTTP_SESSION_SECRET\s+env\s+\*\*\*$", out, re.M)
    assert "s3cret-session-value" not in out and "dbpassw0rd" not in out


def test_config__file_named_by_the_environment(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., tuple[int, str, str]]
) -> None:
    config = clean_env / "tf.toml"
    config.write_text('turn_scope = "conversation"\n', encoding="utf-8")
    monkeypatch.setenv("TOOLFENCE_CONFIG", str(config))

    code, out, _ = cli("config", "--json")

    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0
    assert (rows["TOOLFENCE_TURN_SCOPE"]["value"], rows["TOOLFENCE_TURN_SCOPE"]["source"]) == (
        "conversation", "file",
    )
    assert rows["TOOLFENCE_CONFIG"]["source"] == "env"


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("lease_seconds = \"soon\"\n", ["TOOLFENCE_LEASE_SECONDS='soon' is not a number"]),
        ("no_such_setting = 1\n", ["unknown setting 'no_such_setting'"]),
        ("lease_seconds = \n", ["is not TOML"]),
    ],
)
def test_config_file__bad_value__one_line_naming_it(
    clean_env: Path, cli: Callable[..., tuple[int, str, str]], content: str, fragments: list[str]
) -> None:
    config = clean_env / "bad.toml"
    config.write_text(content, encoding="utf-8")

    code, out, err = cli("--config", str(config), "config")

    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith("toolfence: "), err
    assert all(fragment in err for fragment in fragments), err


def test_config__missing_file__one_line(clean_env: Path, cli: Callable[..., tuple[int, str, str]]) -> None:
    code, _, err = cli("--config", str(clean_env / "absent.toml"), "config")
    assert code == 2
    absent = str(clean_env / "absent.toml")
    assert err == f"toolfence: TOOLFENCE_CONFIG={absent!r}: cannot read it: No such file or directory\n"


# ------------------------------------------------------------------ validation at start


def _toolfence(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    return subprocess.run(
        [sys.executable, "-m", "executor.cli", *args], env={**base, **env}, cwd=cwd,
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TOOLFENCE_LEASE_SECONDS", "abc", "TOOLFENCE_LEASE_SECONDS='abc' is not a number"),
        ("TOOLFENCE_RELAY_BATCH_SIZE", "1.5", "TOOLFENCE_RELAY_BATCH_SIZE='1.5' is not an integer"),
        ("TOOLFENCE_TURN_SCOPE", "team", "TOOLFENCE_TURN_SCOPE='team': one of principal, conversation"),
        ("TOOLFENCE_DB_PING_IDLE_SECONDS", "-1", "TOOLFENCE_DB_PING_IDLE_SECONDS='-1' must be >= 0"),
        (
            "TOOLFENCE_EXPORTER_STUCK_AFTER_SECONDS", "0",
            "TOOLFENCE_EXPORTER_STUCK_AFTER_SECONDS='0' must be positive",
        ),
    ],
)
def test_bad_value__real_process__one_line_and_exit_2(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    # Given a bad value for a setting the command itself never uses
    env = {"TOOLFENCE_HOME": str(tmp_path), name: value}

    # When a command that reads no database runs
    result = _toolfence(env, "config", cwd=tmp_path)

    # Then it stops before anything else: one line naming the variable, exit 2
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr == f"toolfence: {message}\n"


def test_tools_unset__real_process__one_line_naming_it(tmp_path: Path) -> None:
    env = {"TOOLFENCE_HOME": str(tmp_path)}
    assert _toolfence(env, "migrate", cwd=tmp_path).returncode == 0
    (tmp_path / "calls.json").write_text("[]", encoding="utf-8")

    result = _toolfence(
        env, "enqueue", "calls.json", "--tenant", "acme", "--principal", "alice", cwd=tmp_path
    )

    assert result.returncode == 2, result
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("toolfence: TOOLFENCE_TOOLS is not set"), line


def test_tools_module__imported_from_the_directory_toolfence_runs_in(tmp_path: Path) -> None:
    # Given an application's tools beside where toolfence runs (not installed, not on PYTHONPATH)
    (tmp_path / "myapp_tools.py").write_text(
        "from executor import Registry\nregistry = Registry()\n", encoding="utf-8"
    )
    env = {"TOOLFENCE_HOME": str(tmp_path), "TOOLFENCE_TOOLS": "myapp_tools:registry"}
    assert _toolfence(env, "migrate", cwd=tmp_path).returncode == 0

    # When the console script (not `python -m`, which adds the directory itself) sweeps
    script = Path(sys.executable).with_name("toolfence")
    if not script.exists():
        pytest.skip("no toolfence console script beside this interpreter")
    result = subprocess.run(
        [str(script), "reconcile"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}, **env},
    )

    # Then the module loaded
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ one read per process


def test_current__read_once__reload_and_using(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with settings.using(Settings.from_env()):
        monkeypatch.setenv("TOOLFENCE_MAX_ARGUMENT_BYTES", "50")
        # The process's settings were read before the change: kept
        assert settings.current().max_argument_bytes != 50
        # read again on request
        assert settings.reload().max_argument_bytes == 50
        assert settings.current().max_argument_bytes == 50
        with settings.using(Settings.from_env().with_(max_argument_bytes=7)):
            assert settings.current().max_argument_bytes == 7
        assert settings.current().max_argument_bytes == 50


def test_worker_threads__pool_size_passed_as_a_value(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    monkeypatch.setattr(worker, "_work", lambda args: seen.append(settings.current().db_pool_size) or 0)

    def run(*argv: str) -> None:
        args = build_parser().parse_args(["worker", *argv])
        args.loaded = settings.load()
        with settings.using(Settings.from_loaded(args.loaded)):
            worker.run(args)

    run("--pool", "threads", "--concurrency", "32")
    assert "TOOLFENCE_DB_POOL_SIZE" not in os.environ  # a value, not a variable written for later
    run("--pool", "prefork", "--concurrency", "32")
    monkeypatch.setenv("TOOLFENCE_DB_POOL_SIZE", "3")
    run("--pool", "threads", "--concurrency", "32")

    assert seen == [32, 5, 3]


def test_flag_tied_to_a_setting__declared_with_it() -> None:
    parser = build_parser()
    turn = next(a for a in parser._actions if a.dest == "command").choices["turn"]  # noqa: SLF001
    start = next(a for a in turn._actions if a.dest == "turn_command").choices["start"]  # noqa: SLF001
    options = {a.dest: a for a in start._actions}  # noqa: SLF001
    assert "TOOLFENCE_TURN_DRIVER" in (options["driver"].help or "")
    assert options["when_busy"].choices == list(VARIABLES["TOOLFENCE_TURN_WHEN_BUSY"].choices)
    assert options["max_steps"].type is int
    assert all(options[d].default is None for d in ("driver", "when_busy", "max_steps"))
    namespace = parser.parse_args(["turn", "start", "hi", "--tenant", "t", "--principal", "p",
                                   "--conversation", "c"])
    assert isinstance(namespace, argparse.Namespace) and namespace.driver is None


# ------------------------------------------------------------------ the example is not the library


def test_package__ships_no_ledger() -> None:
    found = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = found["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not [p for p in include if p.startswith("ledger")]
    assert (ROOT / "ledger" / "tools.py").exists()


def test_forget__the_next_current_reads_the_environment_again(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given settings read once in this process
    monkeypatch.setenv("TOOLFENCE_MAX_ARGUMENT_BYTES", "60")
    assert settings.current().max_argument_bytes == 60
    monkeypatch.setenv("TOOLFENCE_MAX_ARGUMENT_BYTES", "70")
    assert settings.current().max_argument_bytes == 60
    # When they are forgotten
    settings.forget()
    # Then the next read sees the environment as it is now
    assert settings.current().max_argument_bytes == 70
