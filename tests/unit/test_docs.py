"""docs/design.md is the contract the code cites: these tests keep the two in step.

- every citation `docs/design.md §<Section>`, in any tracked file, names a
  section the document has; so does every pointer of docs/glossary.md;
- the error codes docs/design.md §Results and error codes lists are exactly the
  values of `ErrorCode`;
- the transitions table of docs/design.md §States is exactly
  `LEGAL_TRANSITIONS`;
- no tracked file cites the old, out-of-repo contract file.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from executor.core.states import LEGAL_TRANSITIONS, State
from executor.core.types import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
GLOSSARY = ROOT / "docs" / "glossary.md"

# The section names code and docs cite (`docs/design.md §<Section>`).
SECTIONS = (
    "Promises", "Admission", "Outbox", "Relay", "Worker", "Downstream", "Completion",
    "Reconciler", "Declaring a tool", "Effect contracts", "Operation identity", "States",
    "Results and error codes", "Ordering", "Invariants", "Turns", "HTTP", "Providers and MCP",
    "Layout", "Defaults",
)
# How a text shows the citation form itself (`docs/design.md §<Section>`).
PLACEHOLDER = "<Section>"
# The old contract's file name, spelt in two parts so that this file does not contain it.
OLD_CONTRACT = "DESIGN" + ".md"
# The glossary must define at least these.
REQUIRED_TERMS = (
    "effect contract", "fence / fencing token", "generation", "intent hash", "lease",
    "owner / owner token", "receipt", "settled", "step", "surface", "turn",
)

_SKIPPED_DIRS = {
    ".git", ".venv", ".toolfence", ".pytest_cache", ".mypy_cache", ".ruff_cache",
    ".hypothesis", "__pycache__", "node_modules",
}


def tracked_files() -> list[str]:
    """Paths (relative to the repository) of the files git tracks; outside a git
    checkout, every file but caches and virtual environments."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode("utf-8")
        return [path for path in listed.split("\0") if path and (ROOT / path).is_file()]
    except (OSError, subprocess.CalledProcessError):
        found: list[str] = []
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS and not d.endswith(".egg-info")]
            found.extend(str((Path(folder) / name).relative_to(ROOT)) for name in files)
        return found


def text_of(path: str) -> str | None:
    """A tracked file's text (JSON's `\\u00a7` read as `§`), or None for a binary file."""
    data = (ROOT / path).read_bytes()
    if b"\0" in data:
        return None
    return data.decode("utf-8", "replace").replace("\\u00a7", "§")


def headings() -> list[str]:
    return [
        match.group(2).strip()
        for match in re.finditer(r"^(#{1,4}) (.+)$", DESIGN.read_text(encoding="utf-8"), re.M)
    ]


def _starts_with_name(text: str, name: str) -> bool:
    return text.startswith(name) and not text[len(name):len(name) + 1].isalnum()


def cited_section(after_mark: str) -> str | None:
    """The section a `§` citation names (the text right after the `§`), if it names one
    of docs/design.md's: an agreed section name that starts a heading, or a heading."""
    if after_mark.startswith(PLACEHOLDER):
        return PLACEHOLDER
    names = [s for s in SECTIONS if any(_starts_with_name(h, s) for h in headings())]
    names += headings()
    matches = [name for name in names if _starts_with_name(after_mark, name)]
    return max(matches, key=len) if matches else None


def citations() -> Iterator[tuple[str, int, str]]:
    """(path, line number, text after the section mark) of every citation of the
    design: each mark on a line that names docs/design.md, and each mark in the design
    and the glossary themselves."""
    own = {"docs/design.md", "docs/glossary.md"}
    for path in tracked_files():
        text = text_of(path)
        if text is None or "§" not in text:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if "docs/design.md" not in line and path not in own:
                continue
            for mark in re.finditer("§", line):
                yield path, number, line[mark.end():]


def section(name: str) -> list[str]:
    """The lines of the docs/design.md section whose heading is `name`, up to the next
    heading of the same or a higher level."""
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"^(#{1,4}) (.+)$", line)
        if match and match.group(2).strip() == name:
            level = len(match.group(1))
            body = []
            for following in lines[index + 1:]:
                deeper = re.match(r"^(#{1,4}) ", following)
                if deeper and len(deeper.group(1)) <= level:
                    break
                body.append(following)
            return body
    raise AssertionError(f"docs/design.md has no heading {name!r}")


def table(lines: list[str], first_header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the Markdown table whose first header cell is
    `first_header`."""
    rows: list[list[str]] = []
    inside = False
    for line in lines:
        if not line.startswith("|"):
            if inside:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not inside:
            inside = cells[0] == first_header
            continue
        if set(cells[0]) <= {"-", " ", ":"}:
            continue  # the separator row
        rows.append(cells)
    assert rows, f"no table headed {first_header!r}"
    return rows


def unquote(cell: str) -> str:
    return cell.strip().strip("`")


# ------------------------------------------------------------------ citations


def test_design__has_a_heading_for_every_agreed_section() -> None:
    # Given the agreed section names; when docs/design.md's headings are read
    missing = [name for name in SECTIONS if not any(_starts_with_name(h, name) for h in headings())]
    # Then each names one of them at its start
    assert missing == []


def test_citations__every_section_cited_anywhere__exists_in_the_design() -> None:
    # Given every citation of a docs/design.md section in the repository
    found = list(citations())
    assert found, "no citation of docs/design.md found: the scan is broken"
    # When each is matched against the document's sections
    broken = [
        f"{path}:{number}: §{after[:40]}" for path, number, after in found if cited_section(after) is None
    ]
    # Then every one names a section that exists
    assert broken == []


def test_citations__a_made_up_section__is_refused() -> None:
    # The matcher itself: a section name that is not there, or only a prefix of one.
    assert cited_section("Workers and queues") is None
    assert cited_section("Nowhere") is None
    assert cited_section("Worker).") == "Worker"
    assert cited_section("Results and error codes, below") == "Results and error codes"


def test_no_tracked_file__names_the_old_contract_file() -> None:
    # Given every tracked file
    offenders = [path for path in tracked_files() if OLD_CONTRACT.encode() in (ROOT / path).read_bytes()]
    # Then none cites the contract that is not in the repository
    assert offenders == []


# ------------------------------------------------------------------ the contract's tables


def test_error_codes__listed_in_the_design__are_exactly_the_enum() -> None:
    # Given the codes table of docs/design.md §Results and error codes
    listed = [unquote(row[0]) for row in table(section("Results and error codes"), "Code")]
    # Then it lists every ErrorCode value once, and nothing else
    assert len(listed) == len(set(listed)), "a code is listed twice"
    assert set(listed) == {code.value for code in ErrorCode}


def test_states__transition_table_in_the_design__is_exactly_legal_transitions() -> None:
    # Given the From/To table of docs/design.md §States ("—": no row yet)
    rows = table(section("States"), "From")
    pairs = [
        (None if unquote(row[0]) == "—" else State(unquote(row[0])), State(unquote(row[1])))
        for row in rows
    ]
    # Then it is LEGAL_TRANSITIONS, each pair once
    assert len(pairs) == len(set(pairs)), "a transition is listed twice"
    assert set(pairs) == LEGAL_TRANSITIONS


# ------------------------------------------------------------------ glossary


def glossary_entries() -> list[tuple[str, str]]:
    """(term, text) of each entry: a paragraph that starts with `**term**:`."""
    entries = []
    for paragraph in re.split(r"\n\s*\n", GLOSSARY.read_text(encoding="utf-8")):
        match = re.match(r"\*\*(.+?)\*\*:", paragraph.strip())
        if match:
            entries.append((match.group(1), paragraph))
    return entries


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_glossary__every_entry_points_at_an_existing_design_section() -> None:
    # Given each glossary entry
    entries = glossary_entries()
    assert len(entries) >= len(REQUIRED_TERMS)
    anchors = {github_anchor(h) for h in headings()}
    problems = []
    for term, text in entries:
        links = re.findall(r"\[§([^\]]+)\]\(design\.md#([^)]+)\)", text)
        # Then it has a pointer, and each names a section and links to its anchor
        if not links:
            problems.append(f"{term}: no pointer into docs/design.md")
        for name, anchor in links:
            if cited_section(name) != name or anchor not in anchors or anchor != github_anchor(name):
                problems.append(f"{term}: [§{name}](design.md#{anchor})")
    assert problems == []


def test_glossary__defines_the_required_terms_in_alphabetical_order() -> None:
    terms = [term for term, _ in glossary_entries()]
    assert [t for t in REQUIRED_TERMS if t not in terms] == []
    assert terms == sorted(terms, key=str.lower)


@pytest.mark.parametrize("heading", ["Declaring a tool", "Providers and MCP", "HTTP"])
def test_github_anchor__matches_the_contents_links(heading: str) -> None:
    # The design's own contents list links each section by the same anchor.
    assert f"(#{github_anchor(heading)})" in DESIGN.read_text(encoding="utf-8")
