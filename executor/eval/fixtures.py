"""Eval fixtures: a JSONL file of labelled cases, read with one clear error per bad line.

The first line is the file's header, `{"eval": 1, "tools": ..., "downstream": ...}`:
the registry the fleet's workers load (`module:attribute`, TOOLFENCE_TOOLS), the
downstream whose own records judge the side effects (`module:attribute`, see
`executor.eval.downstream`), and, for an imported dataset, its name and version.
Every other line is one case (docs/eval.md): the user's messages (one durable
turn each, in one conversation) and any prior turns, who asks, the tools it may
use, what a correct proposal is, and what must be true afterwards.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from executor.errors import ConfigurationError

FORMAT_VERSION = 1
CASE_ID_MAX_CHARS = 40


class FixtureError(ConfigurationError):
    """An eval fixtures file cannot be read: the message names the line and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Header(_Strict):
    eval: Literal[1]
    tools: str = Field(pattern=r"^[\w.]+:[\w.]+$")
    downstream: str = Field(pattern=r"^[\w.]+:[\w.]+$")
    dataset: dict[str, Any] | None = None
    description: str = ""


class ToolDoc(_Strict):
    """A tool declared by the case itself (BFCL's function docs): a JSON Schema input."""

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    parameters: dict[str, Any]
    mode: Literal["read", "write"] = "write"


class ExpectedCall(_Strict):
    """One call a correct model proposes. `arguments` are compared exactly (numbers by
    value); `alternatives` lists every accepted value of an argument (BFCL's ground
    truth); an argument named in `optional` may be left out."""

    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    alternatives: dict[str, list[Any]] = Field(default_factory=dict)
    optional: list[str] = Field(default_factory=list)
    turn: int = Field(default=1, ge=1)


class Violation(_Strict):
    """A proposal the executor must not let through: the tool, a subset of its
    arguments, and how it counts as caught (error codes, `approval`: held for a
    person, `reused`: answered from an earlier call). Empty: any refusal."""

    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    caught_as: list[str] = Field(default_factory=list)
    # Set by the perturbing driver, which knows which proposal it perturbed: only that
    # call (of that turn) is the violation, not a correct call with the same arguments.
    call_id: str | None = None
    turn: int | None = None


class ExpectedResult(_Strict):
    """A call's outcome: `succeeded`, `pending` (held for a person) or an error code."""

    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    outcome: str = Field(min_length=1)


class FinalCheck(_Strict):
    """Assertions on the last turn's final answer, compared case-insensitively.
    `{result:TOOL.FIELD}` in `contains` is filled from this run's own result of TOOL,
    so an answer is right only if it agrees with what the tools returned."""

    contains: list[str] = Field(default_factory=list)
    not_contains: list[str] = Field(default_factory=list)


class Expect(_Strict):
    calls: list[ExpectedCall]
    ordered: bool = False
    violations: list[Violation] = Field(default_factory=list)
    results: list[ExpectedResult] = Field(default_factory=list)
    effects: dict[str, int] | None = None
    final: FinalCheck | None = None

    @field_validator("effects")
    @classmethod
    def _counts(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is not None and any(count < 0 for count in value.values()):
            raise ValueError("an effect count is 0 or more")
        return value


class PriorMessage(_Strict):
    role: Literal["user", "assistant"]
    content: str


class Case(_Strict):
    id: str = Field(min_length=1, max_length=CASE_ID_MAX_CHARS, pattern=r"^[A-Za-z0-9_.:-]+$")
    category: str = Field(min_length=1, max_length=64)
    messages: list[str] = Field(min_length=1)
    prior: list[PriorMessage] = Field(default_factory=list)
    tenant: str = "acme"
    principal: str = "alice"
    roles: list[str] = Field(default_factory=lambda: ["member"])
    surface: str | None = None
    tools: list[str | ToolDoc] = Field(min_length=1)
    setup: dict[str, Any] = Field(default_factory=dict)
    foreign_ids: dict[str, str] = Field(default_factory=dict)
    expect: Expect

    @field_validator("messages")
    @classmethod
    def _storable(cls, value: list[str]) -> list[str]:
        # What a turn's message column cannot hold (start_turn refuses it).
        if any("\x00" in m or any("\ud800" <= ch <= "\udfff" for ch in m) for m in value):
            raise ValueError("a message holds no NUL character or lone surrogate")
        return value

    @model_validator(mode="after")
    def _turns_exist(self) -> Case:
        for call in self.expect.calls:
            if call.turn > len(self.messages):
                raise ValueError(f"expect.calls names turn {call.turn}; the case has {len(self.messages)}")
        return self

    @property
    def declared(self) -> tuple[ToolDoc, ...]:
        return tuple(t for t in self.tools if isinstance(t, ToolDoc))

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset(t.name if isinstance(t, ToolDoc) else t for t in self.tools)


@dataclass(frozen=True)
class Fixtures:
    path: Path
    header: Header
    cases: tuple[Case, ...]
    sha256: str

    def case(self, case_id: str) -> Case:
        for case in self.cases:
            if case.id == case_id:
                return case
        raise KeyError(case_id)


def _problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the line"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def parse_lines(lines: Sequence[str], source: str = "fixtures") -> tuple[Header, tuple[Case, ...]]:
    """The header and the cases of a fixtures file's lines (blank lines skipped).
    Raises `FixtureError` naming the first bad line and what is wrong with it."""
    header: Header | None = None
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FixtureError(f"{source}:{number}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(value, Mapping):
            raise FixtureError(f"{source}:{number}: a line is a JSON object, not {type(value).__name__}")
        try:
            if header is None:
                if "eval" not in value:
                    raise FixtureError(
                        f'{source}:{number}: the first line is the header {{"eval": 1, "tools": '
                        '"module:registry", "downstream": "module:downstream"}'
                    )
                header = Header.model_validate(value)
                continue
            case = Case.model_validate(value)
        except ValidationError as exc:
            raise FixtureError(f"{source}:{number}: {_problem(exc)}") from None
        if case.id in seen:
            raise FixtureError(
                f"{source}:{number}: case id {case.id!r} is already used on line {seen[case.id]}"
            )
        seen[case.id] = number
        cases.append(case)
    if header is None:
        raise FixtureError(f"{source}: empty: no header and no case")
    if not cases:
        raise FixtureError(f"{source}: a header and no case")
    return header, tuple(cases)


def load_fixtures(path: str | Path) -> Fixtures:
    path = Path(path).resolve()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FixtureError(f"{path}: not UTF-8 text") from None
    header, cases = parse_lines(text.splitlines(), str(path))
    return Fixtures(path, header, cases, hashlib.sha256(data).hexdigest())
