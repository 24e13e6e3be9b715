"""`executor` is the public API: every name it promises resolves, to where it says,
the three lists in executor/__init__.py agree, the pure modules load no heavy
library through it, and the README and the chapters in docs/ teach only this import.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import executor

ROOT = Path(__file__).resolve().parents[2]
FACADE = ROOT / "executor" / "__init__.py"
README = ROOT / "README.md"
# The documents whose python blocks teach the API: the README and every docs/*.md.
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

PURE_MODULES = (
    "executor.core.admission",
    "executor.core.states",
    "executor.core.tools",
    "executor.core.types",
    "executor.core.canonical",
)
HEAVY_LIBRARIES = (
    "sqlalchemy", "alembic", "celery", "kombu", "redis", "psycopg", "httpx",
    "openai", "anthropic", "google.genai", "mcp", "mcp_types",
)


@cache
def facade_tree() -> ast.Module:
    return ast.parse(FACADE.read_text(encoding="utf-8"))


def literal_assignment(name: str) -> Any:
    for node in facade_tree().body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        )
        if isinstance(target, ast.Name) and target.id == name:
            assert node.value is not None
            return ast.literal_eval(node.value)  # a literal, or this raises
    raise AssertionError(f"executor/__init__.py assigns no {name}")


def type_checking_imports() -> dict[str, str]:
    """name -> module, from the `if TYPE_CHECKING:` block."""
    blocks = [
        node for node in facade_tree().body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, "executor/__init__.py has one `if TYPE_CHECKING:` block"
    found: dict[str, str] = {}
    for statement in blocks[0].body:
        assert isinstance(statement, ast.ImportFrom) and statement.module, ast.unparse(statement)
        for alias in statement.names:
            assert alias.asname is None, f"{alias.name} is imported under another name"
            assert alias.name not in found, f"{alias.name} is imported twice"
            found[alias.name] = statement.module
    return found


# ------------------------------------------------------------------ the three lists


def test_all__is_a_literal_without_duplicates_equal_to_the_exports_map() -> None:
    declared = literal_assignment("__all__")
    assert declared == executor.__all__
    assert len(declared) == len(set(declared)), sorted(n for n in declared if declared.count(n) > 1)
    assert set(declared) == set(literal_assignment("_EXPORTS")) == set(executor._EXPORTS)


def test_type_checking_imports__same_names_from_the_same_modules_as_the_exports_map() -> None:
    # What a type checker sees is what a user gets at run time.
    assert type_checking_imports() == executor._EXPORTS


# ------------------------------------------------------------------ resolving


def _defined_in(value: Any, listed: str) -> bool:
    """`value` is defined in module `listed` (or, when that is a package, below it)."""
    if inspect.isclass(value) or inspect.isfunction(value):
        defined = value.__module__
        listed_is_package = hasattr(importlib.import_module(listed), "__path__")
        return defined == listed or (listed_is_package and defined.startswith(listed + "."))
    return False


def _assigned_at_top_level(name: str, module: str) -> bool:
    source = inspect.getsource(importlib.import_module(module))
    for node in ast.parse(source).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


@pytest.mark.parametrize("name", executor.__all__)
def test_every_name__resolves_to_the_object_its_listed_module_defines(name: str) -> None:
    listed = executor._EXPORTS[name]
    # When the name is read from the facade
    value = getattr(executor, name)
    # Then it is the listed module's own object
    assert value is getattr(importlib.import_module(listed), name)
    # defined there (a class or function) or assigned there (a constant, an alias)
    assert _defined_in(value, listed) or _assigned_at_top_level(name, listed), (
        f"executor.{name} is listed under {listed} but defined in "
        f"{getattr(value, '__module__', '?')}"
    )
    # and a second read is the same object
    assert getattr(executor, name) is value


def test_dir__lists_every_public_name() -> None:
    assert set(executor.__all__) <= set(dir(executor))


def test_unknown_attribute__raises_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        executor.no_such_name  # noqa: B018
    assert not hasattr(executor, "Enqueue")  # names are case-sensitive
    with pytest.raises(ImportError):
        exec("from executor import no_such_name", {})


# ------------------------------------------------------------------ the pure modules stay light


def _heavy_libraries_loaded_by(*modules: str) -> list[str]:
    probe = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        f"heavy = {list(HEAVY_LIBRARIES)!r}\n"
        "print(json.dumps(sorted({h for h in heavy for m in sys.modules"
        " if m == h or m.startswith(h + '.')})))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    loaded: list[str] = json.loads(completed.stdout)
    return loaded


def test_pure_modules__load_no_database_broker_http_or_sdk_library() -> None:
    # Given a fresh interpreter, When it imports the pure modules (and so the facade)
    loaded = _heavy_libraries_loaded_by(*PURE_MODULES)
    # Then none of the heavy libraries is in sys.modules
    assert loaded == []


def test_heavy_library_probe__sees_what_the_store_loads() -> None:
    # The probe above can fail: the store's engine does load SQLAlchemy.
    assert "sqlalchemy" in _heavy_libraries_loaded_by("executor.store.engine")


# ------------------------------------------------------------------ the documents teach the facade

_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+(?:\s*,\s*[\w.]+)*))", re.M)


def internal_imports(code: str) -> list[str]:
    """The modules a snippet imports that a user should take from `executor` instead.

    Line-based, since an excerpt may be a fragment that does not parse. `ledger.`
    stays allowed: the ledger stands for the user's own service and tools."""
    found: list[str] = []
    for match in _IMPORT.finditer(code):
        modules = [match.group(1)] if match.group(1) else [m.strip() for m in match.group(2).split(",")]
        for module in modules:
            top = module.split(".")[0]
            if (top == "executor" and module != "executor") or top in {"outbox", "reconciler"}:
                found.append(module)
    return found


def test_internal_imports__flags_submodules_and_outbox_not_the_facade_or_ledger() -> None:
    code = (
        "from executor import Tool, enqueue\n"
        "import executor\n"
        "from ledger.tools import registry\n"
        "    from executor.core.tools import Tool\n"
        "import json, outbox.producer\n"
        "from reconciler.sweep import sweep\n"
    )
    assert internal_imports(code) == ["executor.core.tools", "outbox.producer", "reconciler.sweep"]


def _python_blocks(document: Path) -> list[tuple[str, str]]:
    """(`path:line` of the opening fence, code) for each python block of a document."""
    lines = document.read_text(encoding="utf-8").splitlines()
    name = document.relative_to(ROOT)
    blocks: list[tuple[str, str]] = []
    index = 0
    while index < len(lines):
        if re.fullmatch(r"```python\s*", lines[index]):
            end = index + 1
            while end < len(lines) and lines[end].rstrip() != "```":
                end += 1
            blocks.append((f"{name}:{index + 1}", "\n".join(lines[index + 1 : end])))
            index = end
        index += 1
    return blocks


def test_python_blocks__named_by_document_and_line() -> None:
    blocks = _python_blocks(README)
    assert blocks and all(where.startswith("README.md:") for where, _ in blocks)


def test_docs__python_blocks_import_toolfence_only_from_executor() -> None:
    blocks = [block for document in DOCUMENTS for block in _python_blocks(document)]
    # The README's own example and the chapters' both teach the facade
    assert any("from executor import" in code for where, code in blocks if where.startswith("README.md:"))
    assert any("from executor import" in code for where, code in blocks if where.startswith("docs/"))
    offending = {where: internal_imports(code) for where, code in blocks if internal_imports(code)}
    assert not offending, f"import these names from `executor`: {offending}"
