"""One error family: every exception toolfence raises derives from
`executor.ToolfenceError`, through one of its kinds; what a tool raises does not.

The classes are found by importing every module of executor/, outbox/ and
reconciler/, so a new exception class joins these checks without being listed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pickle
import pkgutil
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import create_engine, text

import executor
from executor.errors import (
    AdmissionError,
    CommandError,
    ConfigurationError,
    HttpError,
    ProviderError,
    StoreError,
    ToolfenceError,
    TurnError,
    WorkerError,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("executor", "outbox", "reconciler")
KINDS = (
    ConfigurationError, AdmissionError, StoreError, ProviderError, TurnError, HttpError, WorkerError,
    CommandError,
)

# What a tool (or its downstream client) raises, and what passes through a tool's
# code to the worker: the tool author's vocabulary, deliberately not ToolfenceErrors.
TOOL_FAMILY = frozenset({
    "ToolFailure", "RetryableError", "TerminalError", "BusinessRuleViolation", "McpCallFailure",
    "StaleFencingToken", "LostOwnership",
})

# Every toolfence exception: its kind, and the standard base callers caught it by
# before the family existed (kept, so no `except ValueError` changes meaning).
EXPECTED: dict[str, tuple[type[ToolfenceError], type[Exception] | None]] = {
    "SettingsError": (ConfigurationError, ValueError),
    "DatabaseSettingError": (ConfigurationError, ValueError),
    "DatabaseUrlError": (ConfigurationError, ValueError),
    "SchemaNotReady": (ConfigurationError, RuntimeError),
    "DatabaseMissing": (ConfigurationError, RuntimeError),
    "ToolDeclarationError": (ConfigurationError, None),
    "SurfaceDeclarationError": (ConfigurationError, None),
    "UnknownSurface": (ConfigurationError, None),
    "InvalidProgram": (ConfigurationError, ValueError),
    "SandboxUnavailable": (ConfigurationError, None),
    "FixtureError": (ConfigurationError, None),
    "RunDirError": (ConfigurationError, None),
    "InvalidIdentifier": (AdmissionError, ValueError),
    "InvalidBatch": (AdmissionError, ValueError),
    "InvalidResourceSet": (AdmissionError, ValueError),
    "NotCanonicalizable": (AdmissionError, ValueError),
    "StrictJSONError": (AdmissionError, ValueError),
    "Rejected": (AdmissionError, None),
    "AdmissionUnavailable": (AdmissionError, None),
    "AdmissionRaced": (AdmissionError, None),
    "ImpactUnavailable": (AdmissionError, None),
    "RoleResolutionFailed": (AdmissionError, None),
    "StoreDatabaseError": (StoreError, None),
    "ApproverUnavailable": (StoreError, None),
    "PipelineBroken": (StoreError, None),
    "StatementFailed": (StoreError, None),
    "AdapterError": (ProviderError, None),
    "NoApprovalResponse": (ProviderError, ValueError),
    "TurnInProgress": (TurnError, None),
    "DriverError": (TurnError, None),
    "ProblemError": (HttpError, None),
    "KeyRefused": (HttpError, None),
    "InvalidResult": (WorkerError, ValueError),
    "TaskFailed": (WorkerError, None),
    "AmbiguousCommit": (WorkerError, ConnectionError),
    "UserError": (CommandError, None),
    "DemoError": (CommandError, None),
}


def _modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        names.append(package)
        # `__main__` modules run a command when imported.
        names += [
            m.name for m in pkgutil.walk_packages(path, f"{package}.") if not m.name.endswith("__main__")
        ]
    return names


@cache
def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every public exception class defined in the three packages, by name."""
    found: dict[str, type[BaseException]] = {}
    for module_name in _modules():
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value) and issubclass(value, BaseException)
                and value.__module__ == module_name and not name.startswith("_")
            ):
                assert name not in found, f"two exception classes named {name}"
                found[name] = value
    return found


# ------------------------------------------------------------------ the family


def test_discovery__finds_the_known_classes_of_each_family() -> None:
    # The scan below can fail only if it sees the classes: both families are in it.
    found = set(defined_exceptions())
    assert found >= TOOL_FAMILY
    assert found >= set(EXPECTED)
    assert found >= {"ToolfenceError", *(kind.__name__ for kind in KINDS)}


def test_every_toolfence_exception__derives_from_toolfence_error() -> None:
    outside = sorted(
        f"{cls.__module__}.{name}" for name, cls in defined_exceptions().items()
        if name not in TOOL_FAMILY and not issubclass(cls, ToolfenceError)
    )
    assert not outside, f"derive these from a kind in executor/errors.py: {outside}"


def test_tool_failures__are_not_toolfence_errors() -> None:
    found = defined_exceptions()
    inside = sorted(name for name in TOOL_FAMILY if issubclass(found[name], ToolfenceError))
    assert not inside, f"a tool's vocabulary, not toolfence's errors: {inside}"
    # Whatever subclasses ToolFailure belongs to the tool's family too.
    tool_failure = found["ToolFailure"]
    stray = sorted(
        name for name, cls in found.items() if issubclass(cls, tool_failure) and name not in TOOL_FAMILY
    )
    assert not stray, f"ToolFailure subclasses missing from TOOL_FAMILY: {stray}"


def test_every_exception__is_either_classified_or_a_kind() -> None:
    # A new exception class needs a decision: a kind (EXPECTED) or the tool's family.
    found = set(defined_exceptions())
    kinds = {"ToolfenceError", *(kind.__name__ for kind in KINDS)}
    assert found - kinds - TOOL_FAMILY == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exception__has_its_kind_and_keeps_its_standard_base(name: str) -> None:
    cls = defined_exceptions()[name]
    kind, standard = EXPECTED[name]
    if standard is not None:
        assert issubclass(cls, standard), f"{name} is no longer a {standard.__name__}"
    assert issubclass(cls, kind), f"{name} should be a {kind.__name__}"
    assert [k for k in KINDS if issubclass(cls, k)] == [kind], f"{name} has one kind"


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
def test_kind__derives_directly_from_toolfence_error(kind: type[ToolfenceError]) -> None:
    assert kind.__bases__ == (ToolfenceError,)
    assert ToolfenceError.__bases__ == (Exception,)


def test_errors_module__defines_the_base_and_the_kinds_only() -> None:
    module = importlib.import_module("executor.errors")
    classes = {value for value in vars(module).values() if inspect.isclass(value)}
    assert classes == {ToolfenceError, *KINDS}


# ------------------------------------------------------------------ a leaf, exported


def test_errors_module__imports_nothing_of_toolfence() -> None:
    tree = ast.parse((ROOT / "executor" / "errors.py").read_text(encoding="utf-8"))
    imported = [
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    relative = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative
    assert not [m for m in imported if m.split(".")[0] in (*PACKAGES, "ledger")], imported


def test_errors_module__loads_no_other_toolfence_module() -> None:
    # Given a fresh interpreter, When it imports executor.errors (and so the facade)
    probe = (
        "import json, sys\nimport executor.errors\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{(*PACKAGES, 'ledger')!r})))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    # Then nothing but the facade and the module itself is loaded
    assert json.loads(completed.stdout) == ["executor", "executor.errors"]


def test_facade__exports_the_base_and_every_kind() -> None:
    from executor import ToolfenceError as exported

    assert exported is ToolfenceError
    for kind in KINDS:
        assert getattr(executor, kind.__name__) is kind
        assert kind.__name__ in executor.__all__


def test_store_error__is_one_class_wherever_it_is_imported_from() -> None:
    from executor import store
    from executor.store import records

    assert records.StoreError is store.StoreError is StoreError


# ------------------------------------------------------------------ messages and pickling


def test_raised_bare__the_docstring_is_the_message() -> None:
    schema_not_ready = defined_exceptions()["SchemaNotReady"]
    assert str(schema_not_ready()) == " ".join((schema_not_ready.__doc__ or "").split())
    assert str(ToolfenceError()) == "toolfence refused or could not do what was asked."
    # A class without a docstring says its nearest base's.
    assert str(type("Undocumented", (AdmissionError,), {})()) == " ".join(
        (AdmissionError.__doc__ or "").split()
    )


def test_raised_with_arguments__they_are_kept_as_given() -> None:
    error = StoreError("approval a-1 has no operation waiting for it")
    assert error.args == ("approval a-1 has no operation waiting for it",)
    assert StoreError("a", 2).args == ("a", 2)


def test_family__classes_without_a_constructor_of_their_own_pickle_to_the_same_error() -> None:
    # A Celery task's failure crosses from the pool's child to its parent pickled
    # (`TaskFailed`, a message only). Classes with constructors of their own are
    # raised and caught in one process.
    plain = [
        cls for cls in defined_exceptions().values()
        if issubclass(cls, ToolfenceError) and cls.__init__ is ToolfenceError.__init__
    ]
    assert StoreError in plain and WorkerError in plain
    for cls in plain:
        copy = pickle.loads(pickle.dumps(cls("a message")))
        assert type(copy) is cls and copy.args == ("a message",), cls


class _CommitProbe(WorkerError, ConnectionError):
    """A kind combined with OSError's layout, as AmbiguousCommit is."""


def test_kind__combines_with_connection_error() -> None:
    error = _CommitProbe("connection lost after commit")
    assert isinstance(error, OSError) and error.errno is None
    assert str(error) == "connection lost after commit"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is _CommitProbe and str(copy) == str(error)


# ------------------------------------------------------------------ real raises


class _Quote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price_cents: int


def _invalid_identifier() -> None:
    from executor.core.identifiers import IdentifierField, check_identifier

    check_identifier(IdentifierField.TENANT, "")


def _bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from executor.settings import Settings

    monkeypatch.setenv("TOOLFENCE_MAX_ARGUMENT_BYTES", "many")
    Settings.from_env()


def _store_database_error() -> None:
    from executor.store.errors import store_errors

    engine = create_engine("sqlite://")
    with engine.connect() as conn, store_errors():
        conn.execute(text("SELECT * FROM no_such_table"))


def _schema_not_ready(tmp_path: Path) -> None:
    from executor.store.migrate import require_schema

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    require_schema(create_engine(url), url)


def _tool_declaration() -> None:
    from executor.core.tools import Access

    Access.for_roles()


def _invalid_result() -> None:
    from executor.core.tools import Access, Approval, Mode, Tool

    tool = Tool(
        name="quotes.get", description="a price", mode=Mode.READ, input_model=_Quote,
        output_model=_Quote, run=lambda args, ctx: None, access=Access.public_tool(),
        approval=Approval.never(), untrusted_output=False,
    )
    tool.stored_result({"price_cents": "not a number"})


def _adapter_refusal() -> None:
    from executor.providers import openai_chat

    openai_chat.read_proposals({"choices": []})


def _key_refused() -> None:
    from executor.http.keys import split_key

    split_key("not-a-key")


def _strict_json() -> None:
    from executor.core.strictjson import loads_strict

    loads_strict('{"a": 1, "a": 2}', max_bytes=100, max_depth=4)


def _not_canonical() -> None:
    from executor.core.canonical import canonical_json

    canonical_json(2**60)


def _resource_set() -> None:
    from executor.core.scope import declared_resources

    declared_resources("one string")


def _driver(tmp_path: Path) -> None:
    from executor.turns.drivers import ScriptedDriver
    from executor.turns.values import ModelRequest

    request = ModelRequest(purpose="turn", prompt="hello", tools=(), turn_id="t-1", call_index=1)
    ScriptedDriver(path=tmp_path / "no-such-script.jsonl").call(request)


RAISES: dict[str, tuple[str, Callable[..., None]]] = {
    "invalid_identifier": ("InvalidIdentifier", _invalid_identifier),
    "bad_setting": ("SettingsError", _bad_setting),
    "store_database_error": ("StoreDatabaseError", _store_database_error),
    "schema_not_ready": ("SchemaNotReady", _schema_not_ready),
    "tool_declaration": ("ToolDeclarationError", _tool_declaration),
    "invalid_result": ("InvalidResult", _invalid_result),
    "adapter_refusal": ("AdapterError", _adapter_refusal),
    "key_refused": ("KeyRefused", _key_refused),
    "strict_json": ("StrictJSONError", _strict_json),
    "not_canonical": ("NotCanonicalizable", _not_canonical),
    "resource_set": ("InvalidResourceSet", _resource_set),
    "driver": ("DriverError", _driver),
}


@pytest.mark.parametrize("case", sorted(RAISES))
def test_real_raise__is_caught_by_except_toolfence_error(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, raiser = RAISES[case]
    wanted = {"tmp_path": tmp_path, "monkeypatch": monkeypatch}
    arguments = {p: wanted[p] for p in inspect.signature(raiser).parameters}
    expected = defined_exceptions()[name]
    kind = EXPECTED[name][0]
    # Given toolfence code that fails, When it runs under `except ToolfenceError`
    caught: BaseException | None = None
    try:
        raiser(**arguments)
    except ToolfenceError as exc:
        caught = exc
    # Then the base caught it: the class named, of its kind
    assert type(caught) is expected
    assert isinstance(caught, kind)


def test_tool_failure__is_not_caught_by_except_toolfence_error() -> None:
    from executor.core.tools import RetryableError

    def tool_body() -> Any:
        try:
            raise RetryableError("the downstream is down")
        except ToolfenceError:  # a tool author's handler must not swallow its own failure
            return "swallowed"

    with pytest.raises(RetryableError):
        tool_body()
