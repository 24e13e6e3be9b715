"""The README and the chapters in docs/ stay true: their commands and code run,
their excerpts match the code, and every setting, metric, alert and command
they name exists.

The documents are README.md and every docs/*.md; one without fenced blocks
has nothing to run or check there and is skipped by the block tests. Fenced
blocks and the HTML comment on the line right before each:

- ```bash / ```sh / ```console: run for real, in one temporary directory on
  the embedded default (SQLite + filesystem broker), unless marked
  `<!-- needs: <tags> (why) -->`. Only the tags in KNOWN_NEEDS may excuse a
  block: a server, docker, or a process that runs until stopped.
- ```python: either `<!-- run -->` (run, in the same directory and order) or
  `<!-- excerpt: <path> -->` (must appear verbatim in that file). A python
  block with neither fails the test.

The order: the README's blocks first, then each chapter's, in the order of
RUN_ORDER (the order of the README's map of the docs), each file's in document
order, all in the same directory: a chapter may build on what the README or
an earlier chapter set up (docs/turns.md uses the accounts docs/producers.md
opens). A docs file with a runnable block that RUN_ORDER does not list fails
the test, so no block stops running unnoticed. Failures name file:line.

No server is needed; the demo itself is covered by tests/fleet/test_demo.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The order runnable blocks run in, one after another in one directory (see above).
RUN_ORDER = (
    "README.md",
    "docs/tools.md",
    "docs/producers.md",
    "docs/turns.md",
    "docs/eval.md",
    "docs/http.md",
    "docs/errors.md",
    "docs/fleet.md",
    "docs/configuration.md",
    "docs/metrics.md",
    "docs/providers.md",
    "docs/hostile-input.md",
    "docs/guarantees.md",
    "docs/development.md",
)
VENV_BIN = Path(sys.executable).parent
SHELLS = {"bash", "sh", "console"}
KNOWN_NEEDS = {"postgres", "redis", "rabbitmq", "docker", "long-running"}
BLOCK_TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class Block:
    document: str  # path relative to the repository root
    language: str
    code: str
    line: int  # 1-based line of the opening fence
    marker: str | None  # the HTML comment right before the fence, without <!-- -->

    @property
    def needs(self) -> set[str] | None:
        if self.marker is None or not self.marker.startswith("needs:"):
            return None
        return set(self.marker[len("needs:"):].split("(", 1)[0].split())

    @property
    def excerpt_of(self) -> Path | None:
        if self.marker is None or not self.marker.startswith("excerpt:"):
            return None
        return ROOT / self.marker[len("excerpt:"):].strip()

    @property
    def runnable(self) -> bool:
        if self.language in SHELLS:
            return self.needs is None
        return self.language == "python" and self.marker == "run"

    def __str__(self) -> str:
        return f"{self.document}:{self.line} ({self.language})"


@cache
def readme() -> str:
    return README.read_text(encoding="utf-8")


def documents() -> list[Path]:
    """README.md and every docs/*.md, README first."""
    return [README, *sorted(DOCS.glob("*.md"))]


@cache
def documentation() -> str:
    """The text of every document, for the names they use."""
    return "\n".join(path.read_text(encoding="utf-8") for path in documents())


def parse_blocks(text: str, document: str = "README.md") -> list[Block]:
    lines = text.splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = re.fullmatch(r"```(\w*)\s*", lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        previous = index - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        comment = re.fullmatch(r"<!--\s*(.*?)\s*-->", lines[previous].strip()) if previous >= 0 else None
        found.append(
            Block(
                document=document,
                language=opening.group(1),
                code="\n".join(lines[index + 1 : end]) + "\n",
                line=index + 1,
                marker=comment.group(1) if comment else None,
            )
        )
        index = end + 1
    return found


@cache
def blocks_of(relative: str) -> tuple[Block, ...]:
    return tuple(parse_blocks((ROOT / relative).read_text(encoding="utf-8"), relative))


def blocks() -> list[Block]:
    """Every fenced block of every document; a document without any adds none."""
    return [block for path in documents() for block in blocks_of(str(path.relative_to(ROOT)))]


def runnable_in_order() -> list[Block]:
    return [block for relative in RUN_ORDER for block in blocks_of(relative) if block.runnable]


def shell_commands(block: Block) -> str:
    """A console block's `$ ` lines; a bash/sh block as it is."""
    if block.language != "console":
        return block.code
    return "\n".join(line[2:] for line in block.code.splitlines() if line.startswith("$ ")) + "\n"


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFENCE_", "PROMETHEUS_"))}
    env["TOOLFENCE_HOME"] = str(home)
    # What a reader's shell carries from the README's first block: the examples run
    # from the checkout (the reference ledger is not in the installed package) with
    # its tools named.
    env["TOOLFENCE_TOOLS"] = "ledger.tools:registry"
    env["PYTHONPATH"] = str(ROOT)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if block.language == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", shell_commands(block)]
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        output = "(timed out)"
    finally:
        # Anything the block left running in the background dies with it.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, output, None)


# ------------------------------------------------------------------ structure


def test_parse_blocks__marker_is_the_comment_right_before_the_fence() -> None:
    text = "intro\n<!-- needs: docker (why) -->\n\n```bash\nls\n```\n```python\nx = 1\n```\n"
    parsed = parse_blocks(text)
    assert [(b.language, b.line, b.marker) for b in parsed] == [
        ("bash", 4, "needs: docker (why)"),
        ("python", 7, None),
    ]
    assert parsed[0].needs == {"docker"} and not parsed[0].runnable
    assert parsed[1].code == "x = 1\n" and not parsed[1].runnable


def test_parse_blocks__names_its_document_and_line() -> None:
    [block] = parse_blocks("# t\n\n<!-- run -->\n```python\nx = 1\n```\n", "docs/example.md")
    assert str(block) == "docs/example.md:4 (python)" and block.runnable


def test_run_order__lists_every_document_that_has_a_runnable_block() -> None:
    # Each listed document exists, once, the README first
    assert RUN_ORDER[0] == "README.md" and len(set(RUN_ORDER)) == len(RUN_ORDER)
    missing = [relative for relative in RUN_ORDER if not (ROOT / relative).is_file()]
    assert not missing, f"RUN_ORDER names documents that do not exist: {missing}"
    # and no document's runnable block is left out of the run
    unlisted = sorted({b.document for b in blocks() if b.runnable} - set(RUN_ORDER))
    assert not unlisted, f"documents with runnable blocks that RUN_ORDER does not list: {unlisted}"
    assert len(runnable_in_order()) == sum(b.runnable for b in blocks())


def test_docs__every_block_is_run_excerpted_or_excused_for_a_known_reason() -> None:
    for block in blocks():
        if block.language in SHELLS and block.needs is not None:
            assert block.needs and block.needs <= KNOWN_NEEDS, f"{block}: unknown needs {block.needs}"
        if block.language == "python":
            assert block.marker == "run" or block.excerpt_of is not None, (
                f"{block}: a python block is marked <!-- run --> or <!-- excerpt: path -->"
            )
    runnable = [b for b in blocks() if b.runnable]
    # Enough really runs that this test cannot pass by excusing everything,
    # the README's own producer included.
    assert sum(b.language in SHELLS for b in runnable) >= 2
    assert sum(b.language == "python" for b in runnable) >= 2
    assert any(b.language == "python" and b.document == "README.md" for b in runnable)


def test_docs__excerpts_match_the_code_verbatim() -> None:
    excerpts = [b for b in blocks() if b.excerpt_of is not None]
    assert excerpts
    for block in excerpts:
        path = block.excerpt_of
        assert path is not None and path.is_file(), f"{block}: no file {path}"
        assert block.code in path.read_text(encoding="utf-8"), (
            f"{block} no longer matches {path.relative_to(ROOT)}: update {block.document}"
        )


# ------------------------------------------------------------------ running it


def test_docs__commands_and_code_run_on_the_embedded_default(tmp_path: Path) -> None:
    # Given an empty directory and no server configured
    env = _environment(tmp_path / ".toolfence")
    # When every runnable block runs: the README's, then each chapter's (RUN_ORDER)
    for block in runnable_in_order():
        completed = _run(block, tmp_path, env)
        # Then each one succeeds
        assert completed.returncode == 0, f"{block} failed:\n{block.code}\n--- output\n{completed.stdout}"
    # and the state they built is the one the documents describe
    assert (tmp_path / ".toolfence" / "toolfence.db").exists()


# ------------------------------------------------------------------ names it uses


def _code_text(*parts: str) -> str:
    return "\n".join(
        path.read_text(encoding="utf-8", errors="replace")
        for part in parts
        for path in sorted((ROOT / part).rglob("*"))
        if path.is_file() and path.suffix in {".py", ".sh", ".yml", ".yaml", ".cron", ".service", ".timer"}
    )


def test_docs__document_every_setting_the_code_reads() -> None:
    code = _code_text("executor", "outbox", "reconciler", "ledger", "ops")
    names = {n for n in re.findall(r"\bTOOLFENCE_[A-Z0-9_]+", code) if not n.endswith("_")}
    names.add("PROMETHEUS_MULTIPROC_DIR")
    missing = sorted(n for n in names if f"`{n}`" not in documentation())
    assert not missing, f"settings the code reads that neither the README nor docs/ documents: {missing}"


def _metric_base(name: str) -> str:
    return re.sub(r"_(total|bucket|count|sum)$", "", name)


def test_docs__every_metric_they_name_is_defined_in_the_code() -> None:
    telemetry = ROOT / "executor" / "telemetry"
    code = (telemetry / "metrics.py").read_text() + (telemetry / "exporter.py").read_text()
    defined = {_metric_base(n) for n in re.findall(r'"(toolfence_[a-z0-9_]+)"', code)}
    from executor.store import schema

    tables = set(schema.metadata.tables) | {"toolfence_alembic_version"}
    named = {n for n in re.findall(r"\btoolfence_[a-z0-9_]+", documentation()) if n not in tables}
    unknown = sorted(n for n in named if _metric_base(n) not in defined)
    assert named and not unknown, f"metrics the documents name that the code does not define: {unknown}"


def test_docs__every_alert_they_name_is_in_the_rules() -> None:
    rules = (ROOT / "ops" / "alerts.yml").read_text()
    import executor

    # `ToolfenceError` and its like are the facade's classes, not alerts.
    named = {n for n in re.findall(r"\b(Toolfence[A-Z]\w+)", documentation()) if not hasattr(executor, n)}
    assert named and all(f"alert: {n}" in rules for n in named), sorted(
        n for n in named if f"alert: {n}" not in rules
    )


def test_docs__every_cli_command_they_name_exists() -> None:
    from executor.cli.main import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001
    assert subcommands is not None
    shell_text = "\n".join(
        re.sub(r"(^|\s)#.*$", "", line)  # a comment may say "toolfence vs …"
        for b in blocks() if b.language in SHELLS
        for line in shell_commands(b).splitlines()
    )
    spans = "\n".join(re.findall(r"`(toolfence [^`]+)`", documentation()))
    used = set(re.findall(r"(?:^|[\s(/])toolfence ([a-z][a-z-]*)", shell_text + "\n" + spans, re.M))
    assert used and used <= set(subcommands), f"unknown subcommands: {sorted(used - set(subcommands))}"


@pytest.mark.parametrize("target", ["demo", "test"])
def test_readme__the_two_commands_are_make_targets(target: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^{target}:", makefile, re.M)
    assert f"make {target}" in readme()


# ------------------------------------------------------------------ the front door and its map

README_MAX_LINES = 600


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    """The anchors of a document's headings, outside fenced blocks (repeats get -1, -2, ...)."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.+)", line)
        if heading:
            slug, counter = _slug(heading.group(1)), 0
            while (slug if not counter else f"{slug}-{counter}") in found:
                counter += 1
            found.add(slug if not counter else f"{slug}-{counter}")
    return found


def test_slug__the_anchors_github_gives() -> None:
    assert _slug("What `make demo` shows") == "what-make-demo-shows"
    assert _slug("Approved set = changed set") == "approved-set--changed-set"
    assert _slug("HTTP API and operator console (`toolfence serve`)") == (
        "http-api-and-operator-console-toolfence-serve"
    )
    assert _anchors("# A\n```bash\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_readme__is_a_front_door_with_a_contents_list() -> None:
    lines = readme().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move a chapter to docs/"
    assert "## Contents" in lines
    contents = readme().split("## Contents", 1)[1].split("\n## ", 1)[0]
    # the contents list names every section of the README
    linked = set(re.findall(r"\]\(#([^)]+)\)", contents))
    sections = {_slug(line[3:]) for line in lines if line.startswith("## ") and line != "## Contents"}
    assert sections and sections <= linked, f"sections missing from the contents: {sorted(sections - linked)}"


def test_docs__links_within_a_document_reach_one_of_its_headings() -> None:
    for path in documents():
        text = path.read_text(encoding="utf-8")
        targets = set(re.findall(r"\]\(#([^)]+)\)", text))
        missing = sorted(targets - _anchors(text))
        assert not missing, f"{path.relative_to(ROOT)} links to headings it does not have: {missing}"


def test_readme__links_to_the_chapters_it_moved_into_docs() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme()))
    # every file in docs/ except images, and the index of the decisions
    files = {str(p.relative_to(ROOT)) for p in DOCS.iterdir() if p.is_file() and p.suffix in {".md", ".json"}}
    files |= {str(p.relative_to(ROOT)) for p in DOCS.glob("*/README.md")}
    assert {relative for relative in RUN_ORDER if relative != "README.md"} <= files
    assert not files - linked, f"docs the README's map does not link: {sorted(files - linked)}"


def test_docs__each_chapter_starts_with_a_title_and_an_introduction() -> None:
    for relative in RUN_ORDER[1:]:
        lines = (ROOT / relative).read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# ") and not lines[1].strip(), f"{relative}: a title first"
        assert lines[2].strip() and not lines[2].startswith(("#", "-", "|", "<!--", "```")), (
            f"{relative}: a paragraph saying what the chapter holds, after its title"
        )


# ------------------------------------------------------------------ paths and modules it names

# The documents that point readers at files: the README, everything in docs/
# (chapters, the contract, the decisions), the benchmark and chaos reports (and
# the template the chaos report is written from).
DOCUMENTS = [README, *sorted(DOCS.rglob("*.md")), *sorted((ROOT / "bench").glob("*.md")),
             ROOT / "tests" / "chaos" / "report.py"]
_REPO_PATH = re.compile(r"`((?:executor|outbox|reconciler|ledger|ops|tests|bench|docs)/[^`\s]*)`")
_DOTTED_NAME = re.compile(r"\bexecutor(?:\.[A-Za-z_]\w*)+")


def _resolves(dotted: str) -> bool:
    """`a.b.c.name` is a module, or an attribute of the longest module prefix."""
    import importlib

    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_resolves__modules_and_their_attributes_only() -> None:
    assert _resolves("executor.store.clock") and _resolves("executor.store.clock.db_now")
    assert not _resolves("executor.exporter.MultiprocessTreeCollector")
    assert not _resolves("executor.store.clock.no_such_function")


def test_docs__every_repository_path_they_name_exists() -> None:
    named = [(doc, path) for doc in DOCUMENTS for path in _REPO_PATH.findall(doc.read_text(encoding="utf-8"))]
    assert any(path.startswith("executor/") and path.endswith(".py") for _, path in named)
    missing = sorted(f"{doc.relative_to(ROOT)}: {path}" for doc, path in named if not (ROOT / path).exists())
    assert not missing, f"paths that no longer exist (moved?): {missing}"


def test_docs__every_executor_module_they_name_resolves() -> None:
    # Markdown spans, and comments in ops/ files (entrypoint, units, config).
    sources = [doc for doc in DOCUMENTS if doc.suffix == ".md"]
    sources += [p for p in sorted((ROOT / "ops").rglob("*")) if p.is_file() and p.suffix != ".json"]
    sources += [ROOT / "Dockerfile"]
    named = {
        (source.relative_to(ROOT), name.rstrip("."))
        for source in sources
        for name in _DOTTED_NAME.findall(source.read_text(encoding="utf-8", errors="replace"))
    }
    assert named
    unresolved = sorted(f"{source}: {name}" for source, name in named if not _resolves(name))
    assert not unresolved, f"module names that no longer resolve (moved?): {unresolved}"
