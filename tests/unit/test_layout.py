"""The package layout's rules, checked statically over every module's imports.

docs/design.md §Layout: dependencies point down. Pure `executor/core` imports no
database, broker or HTTP library and no other part of toolfence; `providers`
and `mcp` import only `core`; nothing but `cli` imports `ledger`. And: the
reconciler never loads the worker, and the clock never imports the engine
(the engine builds on the clock). Beyond the layers: no import cycle among the
modules of executor, outbox and reconciler, the relay never loads the worker
(publishing lives in executor/broker), and no source file there is over 800 lines.

Every import counts, at module level or inside a function (`ast.walk`), and so
does `importlib.import_module("literal")`. An import under `if TYPE_CHECKING:`
loads nothing, so it is exempt from the rules about what a module *loads*
(libraries, the clock's cycle); it still counts as a dependency for the rules
about which part of toolfence may depend on which.

`from P import X` resolves to `P.X` when that is a module, to the module P's
`__init__` re-exports X from when it does (for the `executor` facade, the
module `_EXPORTS` names), else to P.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("executor", "outbox", "reconciler", "ledger")

DATABASE_LIBRARIES = ("sqlalchemy", "alembic", "psycopg", "psycopg2", "psycopg_pool", "asyncpg", "sqlite3")
BROKER_LIBRARIES = ("celery", "kombu", "redis", "amqp", "billiard", "fakeredis", "pika")
HTTP_LIBRARIES = (
    "httpx", "requests", "aiohttp", "urllib3", "http", "urllib.request", "socket",
    # provider and MCP SDKs: network clients
    "openai", "anthropic", "google.genai", "mcp", "mcp_types",
)

# executor's parts, and the parts of toolfence each may import (its own included).
# `executor` is the public facade (executor/__init__.py), above every part.
LAYERS: dict[str, set[str]] = {
    # `executor.errors` is a leaf (it imports nothing of toolfence): every part may raise its kinds.
    "executor.errors": {"executor.errors"},
    "executor.core": {"executor.core", "executor.errors"},
    "executor.settings": {"executor.core", "executor.errors", "executor.settings"},
    "executor.store": {"executor.core", "executor.errors", "executor.settings", "executor.store"},
    "executor.providers": {"executor.core", "executor.errors", "executor.providers"},
    "executor.mcp": {"executor.core", "executor.errors", "executor.mcp"},
    # Code execution as a tool: declared on the core, bounded by the settings.
    "executor.sandbox": {"executor.core", "executor.errors", "executor.settings", "executor.sandbox"},
    "executor.telemetry": {
        "executor.core", "executor.errors", "executor.settings", "executor.store", "executor.telemetry",
    },
    # Test-only fault points, fired by the worker and the relay.
    "executor.faults": {"executor.errors", "executor.settings", "executor.faults"},
    # Publishing to the broker (task names, the app's configuration, publishers): the
    # relay's and the worker's common ground, standing on neither.
    "executor.broker": {"executor.core", "executor.errors", "executor.settings", "executor.broker"},
    # The turn package: its pure parts (below) read no database or broker; `service`
    # (start_turn, get_turn) stands on the store and reads results through outbox.results.
    "executor.turns": {
        "executor.core", "executor.errors", "executor.settings", "executor.store", "executor.telemetry",
        "executor.providers", "executor.turns", "outbox.results",
    },
    # The turn job runs the loop: it enqueues a step's calls (outbox.producer) and reads
    # their results (outbox.results).
    "executor.worker": {
        "executor.core", "executor.errors", "executor.settings", "executor.store", "executor.telemetry",
        "executor.worker", "executor.providers", "executor.turns", "executor.broker", "executor.faults",
        "outbox.producer", "outbox.results",
    },
    # `toolfence serve`: admits through the producer API, decides through the store.
    "executor.http": {
        "executor.core", "executor.errors", "executor.settings", "executor.store", "executor.telemetry",
        "executor.providers", "executor.turns", "executor.http", "outbox",
    },
    # `toolfence eval`: turns started and read back through the turn service, tools
    # declared through the MCP schema path; its fleet is the CLI's (`executor.cli.fleet`).
    "executor.eval": {
        "executor.core", "executor.errors", "executor.settings", "executor.store", "executor.turns",
        "executor.mcp", "executor.eval",
    },
    "executor.cli": {"executor", "outbox", "reconciler", "ledger"},  # the top: anything
}


@dataclass(frozen=True)
class Import:
    path: Path  # relative to ROOT
    line: int
    module: str  # absolute, resolved
    type_checking: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


def is_within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def is_package(module: str) -> bool:
    return (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()


def source_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            for statement in node.body:
                inside.update(id(child) for child in ast.walk(statement))
    return inside


@cache
def reexports(package: str) -> dict[str, str]:
    """Names a toolfence package's `__init__` takes from elsewhere: name -> module."""
    path = module_path(package)
    if path is None or path.name != "__init__.py":
        return {}
    tree = _tree(path)
    if package == "executor":
        # The facade imports lazily: `_EXPORTS` is its map.
        for node in tree.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and node.target.id == "_EXPORTS" and node.value is not None:
                exports: dict[str, str] = ast.literal_eval(node.value)
                return exports
        raise AssertionError("executor/__init__.py has no literal _EXPORTS")
    found: dict[str, str] = {}
    skip = _type_checking_nodes(tree)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and id(node) not in skip:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return found


def _resolve_from(package: str, name: str) -> str:
    if module_path(f"{package}.{name}") is not None:
        return f"{package}.{name}"
    return reexports(package).get(name, package)


def imports_of(path: Path) -> list[Import]:
    this = module_name(path)
    this_package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    return imports_in(_tree(path), path.relative_to(ROOT), this_package)


def imports_in(tree: ast.Module, relative: Path, this_package: str) -> list[Import]:
    type_checking = _type_checking_nodes(tree)
    found: list[Import] = []

    def add(node: ast.AST, module: str) -> None:
        found.append(Import(relative, getattr(node, "lineno", 0), module, id(node) in type_checking))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = this_package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                add(node, _resolve_from(base, alias.name) if base.split(".")[0] in PACKAGES else base)
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in {"import_module", "__import__"})
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node, node.args[0].value)
    return found


def all_imports() -> Iterator[Import]:
    for path in source_files():
        yield from imports_of(path)


def part_of(module: str) -> str:
    """The layer a toolfence module belongs to: `executor.<part>` or its top package."""
    parts = module.split(".")
    if parts[0] == "executor" and len(parts) > 1:
        return f"executor.{parts[1]}"
    return parts[0]


def _report(violations: list[Import], rule: str) -> str:
    return f"{rule}:\n" + "\n".join(f"  {v}" for v in violations)


# ------------------------------------------------------------------ the checker itself


def test_imports_in__resolves_relative_facade_reexported_and_function_level_imports() -> None:
    # Given a module of executor/core with one import of each kind the rules depend on
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import states\n"
        "from executor import make_engine, store\n"
        "from executor.store import reserve\n"
        "if TYPE_CHECKING:\n"
        "    import celery\n"
        "def later() -> None:\n"
        "    import sqlalchemy\n"
        "    importlib.import_module('ledger.tools')\n"
    )
    # When its imports are read
    imports = imports_in(ast.parse(source), Path("executor/core/probe.py"), "executor.core")
    found = {(i.module, i.type_checking) for i in imports}
    # Then each resolves to the module that is really loaded
    assert found == {
        ("typing", False),
        ("executor.core.states", False),
        ("executor.store.engine", False),
        ("executor.store", False),
        ("executor.store.operations", False),
        ("celery", True),
        ("sqlalchemy", False),
        ("ledger.tools", False),
    }


def test_layout__every_package_is_read() -> None:
    files = {path.relative_to(ROOT).parts[0] for path in source_files()}
    assert files == set(PACKAGES)
    parts = {part_of(module_name(path)) for path in (ROOT / "executor").rglob("*.py")}
    assert parts - {"executor"} == set(LAYERS), "a new part of executor/ needs its place in LAYERS"


# ------------------------------------------------------------------ the rules


def test_core__imports_no_database_broker_or_http_library() -> None:
    violations = [
        i for i in all_imports()
        if i.path.parts[:2] == ("executor", "core") and not i.type_checking
        and is_within(i.module, DATABASE_LIBRARIES + BROKER_LIBRARIES + HTTP_LIBRARIES)
    ]
    assert not violations, _report(violations, "executor/core is pure")


def test_providers_and_mcp__import_no_database_or_broker_library() -> None:
    violations = [
        i for i in all_imports()
        if i.path.parts[:2] in {("executor", "providers"), ("executor", "mcp")} and not i.type_checking
        and is_within(i.module, DATABASE_LIBRARIES + BROKER_LIBRARIES)
    ]
    assert not violations, _report(violations, "providers and mcp stay off the database and broker")


@pytest.mark.parametrize("part", sorted(LAYERS))
def test_dependencies_point_down(part: str) -> None:
    allowed = LAYERS[part]
    violations = [
        i for i in all_imports()
        if part_of(module_name(ROOT / i.path)) == part
        and i.module.split(".")[0] in PACKAGES
        and not is_within(i.module, allowed)
    ]
    assert not violations, _report(violations, f"{part} may import only {sorted(allowed)}")


TURNS_PURE = ("values", "contract", "native", "prompt", "loop", "audit", "drivers", "sdk", "specs")


def test_turns__pure_parts_import_no_database_or_broker_library() -> None:
    # The model as a pure function: everything but `service` decides without I/O.
    pure = {("executor", "turns", f"{name}.py") for name in TURNS_PURE}
    assert all((ROOT / Path(*parts)).is_file() for parts in pure)
    violations = [
        i for i in all_imports()
        if i.path.parts in pure and not i.type_checking
        and (is_within(i.module, DATABASE_LIBRARIES + BROKER_LIBRARIES)
             or is_within(i.module, ["executor.store", "executor.worker", "outbox"]))
    ]
    assert not violations, _report(violations, "executor/turns' pure parts stay off the database and broker")


def test_ledger__imported_by_nothing_but_cli() -> None:
    # docs/design.md §Layout: "nothing but `cli` imports `ledger`" (outbox and reconciler included).
    violations = [
        i for i in all_imports()
        if is_within(i.module, ["ledger"])
        and i.path.parts[0] != "ledger"
        and i.path.parts[:2] != ("executor", "cli")
    ]
    assert not violations, _report(violations, "only executor/cli imports ledger")


def _reachable(start: Iterable[str]) -> dict[str, Import | None]:
    """Every toolfence module loaded by importing `start`, each with the import that
    first reached it; type-only imports load nothing and are not followed."""
    reached: dict[str, Import | None] = {module: None for module in start}
    queue = list(reached)
    while queue:
        path = module_path(queue.pop())
        if path is None:
            continue
        for found in imports_of(path):
            if found.type_checking or found.module.split(".")[0] not in PACKAGES:
                continue
            # Importing a.b.c runs a/__init__ and a/b/__init__ first.
            parts = found.module.split(".")
            for depth in range(1, len(parts) + 1):
                module = ".".join(parts[:depth])
                if module not in reached:
                    reached[module] = found
                    queue.append(module)
    return reached


def test_reconciler__loads_no_worker_module() -> None:
    reconciler_modules = [module_name(path) for path in (ROOT / "reconciler").rglob("*.py")]
    reached = _reachable(reconciler_modules)
    violations = sorted(
        f"{module} (through {via})" for module, via in reached.items()
        if is_within(module, ["executor.worker"])
    )
    assert not violations, "the reconciler must not load the worker:\n  " + "\n  ".join(violations)


def test_clock__imports_nothing_from_the_engine() -> None:
    clock = ROOT / "executor" / "store" / "clock.py"
    violations = [
        i for i in imports_of(clock)
        if not i.type_checking
        # The store package's __init__ imports the engine as well.
        and (is_within(i.module, ["executor.store.engine"]) or i.module in {"executor", "executor.store"})
    ]
    assert not violations, _report(violations, "executor/store/clock.py must not import the engine")


# ------------------------------------------------------------------ cycles, the relay, file sizes

CYCLE_PACKAGES = ("executor", "outbox", "reconciler")


def _dependency_graph() -> dict[str, set[str]]:
    """Module -> the toolfence modules it imports (every import that loads something,
    at module level or inside a function; a package's own `__init__` is not counted
    for its submodules, as Python runs it before them without a cycle)."""
    graph: dict[str, set[str]] = {}
    for path in source_files():
        this = module_name(path)
        if this.split(".")[0] not in CYCLE_PACKAGES:
            continue
        targets = graph.setdefault(this, set())
        for found in imports_of(path):
            if found.type_checking or found.module == this or module_path(found.module) is None:
                continue
            if found.module.split(".")[0] in CYCLE_PACKAGES:
                targets.add(found.module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (or a module importing
    itself), each sorted: Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def test_cycles__finds_a_function_level_circle_and_nothing_in_a_chain() -> None:
    # Given a chain a -> b -> c, and d <-> e where e's import of d sits in a function
    chain = {"a": {"b"}, "b": {"c"}, "c": set()}
    probe = ast.parse("def later() -> None:\n    from executor.http import server\n")
    [back] = imports_in(probe, Path("executor/http/console.py"), "executor.http")
    circle = {"executor.http.server": {"executor.http.console"}, "executor.http.console": {back.module}}
    # Then the chain has no cycle and the circle is one, function-level import included
    assert cycles(chain) == []
    assert cycles(circle) == [["executor.http.console", "executor.http.server"]]


def test_no_import_cycle_among_executor_outbox_and_reconciler() -> None:
    found = cycles(_dependency_graph())
    assert not found, "import cycles (module-level or function-level imports):\n  " + "\n  ".join(
        " <-> ".join(component) for component in found
    )


def test_relay__loads_nothing_from_the_worker() -> None:
    # Publishing has its own home (executor/broker); the relay stands beside the worker.
    reached = _reachable(["outbox.relay"])
    violations = sorted(
        f"{module} (through {via})" for module, via in reached.items()
        if is_within(module, ["executor.worker"])
    )
    assert not violations, "the relay must not load the worker:\n  " + "\n  ".join(violations)


MAX_LINES = 800


def test_no_source_file_over_800_lines() -> None:
    too_long = {
        path.relative_to(ROOT): lines
        for path in source_files()
        if path.relative_to(ROOT).parts[0] in CYCLE_PACKAGES
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"files over {MAX_LINES} lines: {too_long}"
