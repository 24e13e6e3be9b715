"""The decision records in docs/decisions/: names, fields, links between records, the index.

Each record is `NNNN-<slug>.md` (0000 is the template), numbered without gaps, with a
`# NNNN. Title` line, a Status, a Date and the Context, Decision and Consequences
sections. A superseded record names the record that replaced it, and that record says
so back. The index (docs/decisions/README.md) lists every record once, with the title,
status and date the record has. Nothing in the repository points at the single file
the records were split from, and every `docs/decisions/NNNN` it names exists.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "decisions"
INDEX = RECORDS / "README.md"
# Spelled in two pieces so that this file does not name it.
OLD_FILE = "docs/" + "decisions.md"

_FILE_NAME = re.compile(r"^(\d{4})-([a-z0-9]+(?:-[a-z0-9]+)*)\.md$")
_TITLE = re.compile(r"^# (\d{4})\. (\S.*)$")
_STATUS = re.compile(r"^Accepted$|^Superseded by \[(\d{4})\]\((\d{4}-[a-z0-9-]+\.md)\)$")
_SUPERSEDES = re.compile(r"^\[(\d{4})\]\((\d{4}-[a-z0-9-]+\.md)\)$")
_FIELD = re.compile(r"^- ([A-Z][a-z]+): (.+)$")
_SECTIONS = ["Context", "Decision", "Consequences"]
_LINK = re.compile(r"\]\((\d{4}-[a-z0-9-]+\.md)\)")
_INDEX_ROW = re.compile(r"^\| (\d{4}) \| \[(.+)\]\((\d{4}-[a-z0-9-]+\.md)\) \| (.+) \| (\d{4}-\d\d-\d\d) \|$")
_REPO_REFERENCE = re.compile(r"docs/decisions/(\d{4})(-[a-z0-9]+(?:-[a-z0-9]+)*\.md)?")


@dataclass(frozen=True)
class Record:
    path: Path
    number: int
    title: str
    fields: dict[str, str]
    sections: dict[str, str]
    section_order: list[str]


def parse(path: Path) -> Record:
    lines = path.read_text(encoding="utf-8").split("\n")
    title = _TITLE.match(lines[0])
    assert title, f"{path.name}: the first line is not '# NNNN. Title'"
    fields: dict[str, str] = {}
    at = 1
    while at < len(lines) and not lines[at].startswith("## "):
        field = _FIELD.match(lines[at])
        if field:
            assert field.group(1) not in fields, f"{path.name}: {field.group(1)} given twice"
            fields[field.group(1)] = field.group(2)
        at += 1
    sections: dict[str, str] = {}
    order: list[str] = []
    current = None
    for line in lines[at:]:
        if line.startswith("## "):
            current = line[3:].strip()
            order.append(current)
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return Record(path, int(title.group(1)), title.group(2), fields, sections, order)


@cache
def records() -> dict[int, Record]:
    found: dict[int, Record] = {}
    for path in sorted(RECORDS.glob("*.md")):
        if path == INDEX:
            continue
        record = parse(path)
        found[record.number] = record
    return found


def record_files() -> list[Path]:
    return sorted(path for path in RECORDS.glob("*.md") if path != INDEX)


def superseded_by(record: Record) -> int | None:
    status = _STATUS.match(record.fields["Status"])
    assert status, f"{record.path.name}: unknown status {record.fields['Status']!r}"
    return int(status.group(1)) if status.group(1) else None


def test_file_names__nnnn_slug_unique_and_contiguous_from_0000() -> None:
    files = record_files()
    assert len(files) > 100
    bad = [path.name for path in files if not _FILE_NAME.match(path.name)]
    assert not bad, f"not NNNN-slug.md: {bad}"
    numbers = [int(_FILE_NAME.match(path.name).group(1)) for path in files]  # type: ignore[union-attr]
    duplicates = sorted({n for n in numbers if numbers.count(n) > 1})
    assert not duplicates, f"numbers used twice: {duplicates}"
    assert numbers == list(range(len(numbers))), "numbers must run 0000, 0001, … without a gap"
    assert (RECORDS / "0000-template.md").exists()


@pytest.mark.parametrize("path", record_files(), ids=lambda p: p.name[:4])
def test_record__title_fields_and_sections(path: Path) -> None:
    record = parse(path)
    assert f"{record.number:04d}-" == path.name[:5], f"{path.name}: the title's number is not the file's"
    assert {"Status", "Date"} <= set(record.fields), f"{path.name}: Status and Date are required"
    assert set(record.fields) <= {"Status", "Date", "Supersedes", "Topic"}, f"{path.name}: unknown field"
    superseded_by(record)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", record.fields["Date"]), f"{path.name}: Date is not YYYY-MM-DD"
    datetime.date.fromisoformat(record.fields["Date"])
    assert record.section_order == _SECTIONS, f"{path.name}: sections {record.section_order}"
    empty = [name for name in _SECTIONS if not record.sections[name].strip()]
    assert not empty, f"{path.name}: empty sections {empty}"


def test_records__supersession_points_at_records_and_both_ends_agree() -> None:
    all_records = records()
    pairs = set()
    for record in all_records.values():
        newer = superseded_by(record)
        if newer is not None:
            assert newer in all_records and newer != record.number, f"{record.path.name}: by {newer:04d}?"
            pairs.add((newer, record.number))
    supersedes = set()
    for record in all_records.values():
        if "Supersedes" in record.fields:
            older = _SUPERSEDES.match(record.fields["Supersedes"])
            assert older, f"{record.path.name}: Supersedes is not a link to a record"
            supersedes.add((record.number, int(older.group(1))))
    assert pairs, "no record is superseded: the check below would prove nothing"
    assert pairs == supersedes, "a 'Superseded by' without the matching 'Supersedes', or the reverse"


def test_records__links_between_records_resolve() -> None:
    names = {path.name for path in record_files()}
    broken = sorted(
        f"{path.name} -> {target}"
        for path in [*record_files(), INDEX]
        for target in _LINK.findall(path.read_text(encoding="utf-8"))
        if target not in names
    )
    assert not broken, f"links to records that do not exist: {broken}"


def test_index__lists_every_record_once_with_its_title_status_and_date() -> None:
    rows = [_INDEX_ROW.match(line) for line in INDEX.read_text(encoding="utf-8").split("\n")]
    listed = [row for row in rows if row]
    numbers = [int(row.group(1)) for row in listed]
    all_records = records()
    expected = sorted(n for n in all_records if n != 0)
    assert sorted(numbers) == expected, (
        f"missing {sorted(set(expected) - set(numbers))}, "
        f"twice {sorted({n for n in numbers if numbers.count(n) > 1})}, "
        f"unknown {sorted(set(numbers) - set(expected))}"
    )
    for row in listed:
        record = all_records[int(row.group(1))]
        assert row.group(2).replace("\\|", "|") == record.title, f"{row.group(1)}: index title differs"
        assert row.group(3) == record.path.name, f"{row.group(1)}: index links {row.group(3)}"
        assert row.group(4) == record.fields["Status"], f"{row.group(1)}: index status differs"
        assert row.group(5) == record.fields["Date"], f"{row.group(1)}: index date differs"


def repository_text_files() -> list[Path]:
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    files = []
    for name in listed:
        path = ROOT / name
        if name and path.is_file() and path.suffix not in {".png", ".ico", ".gz", ".whl"}:
            files.append(path)
    assert len(files) > 100
    return files


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_repository__nothing_references_the_old_single_file() -> None:
    found = sorted(str(path.relative_to(ROOT)) for path in repository_text_files() if OLD_FILE in _text(path))
    assert not found, f"still pointing at {OLD_FILE}: {found}"


def test_repository__every_record_it_names_exists() -> None:
    names = {path.name for path in record_files()}
    numbers = {name[:4] for name in names}
    seen = 0
    broken = []
    for path in repository_text_files():
        for number, slug in _REPO_REFERENCE.findall(_text(path)):
            seen += 1
            if number not in numbers or (slug and f"{number}{slug}" not in names):
                broken.append(f"{path.relative_to(ROOT)}: docs/decisions/{number}{slug}")
    assert seen, "no reference found: the pattern is wrong"
    assert not broken, f"references to records that do not exist: {sorted(broken)}"
