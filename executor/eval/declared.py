"""Tools a fixtures file declares itself (BFCL's function docs), for an eval fleet.

`registry()` (TOOLFENCE_TOOLS=executor.eval.declared:registry) builds a Registry
from every tool the cases of TOOLFENCE_EVAL_FIXTURES declare, each through the
JSON-schema path toolfence uses for MCP tools (`executor.mcp.schema`), so their
arguments are validated by the declared schema, closed to undeclared keys. Each
case gets a turn surface `eval-<case id>` whose catalog is its own tools: its
turns see only them, as the model saw them in the dataset.

The handlers are recording no-ops: a write records one row in `eval_tool_records`
(this downstream's own table), deduplicated on the idempotency key (effect
`idempotent`), and answers with the receipt. `downstream` counts those rows, so
side-effect exactness is judged from what the handler recorded.

Tenancy, for the perturbing driver's "another tenant's id": a string argument of
the form `@TENANT/...` names a resource of TENANT, and the access rule refuses a
caller of another tenant (a stand-in for the ownership a real downstream checks).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.engine import Engine

from executor.core.surfaces import TurnSurface, Writes
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import ServerContext
from executor.eval.fixtures import Case, FixtureError, ToolDoc, load_fixtures
from executor.mcp.schema import arguments_model
from executor.settings import read
from executor.store.engine import insert_ignore, make_engine

SURFACE_PREFIX = "eval-"
MEMBERS = ("member",)

metadata = MetaData()
records = Table(
    "eval_tool_records",
    metadata,
    Column("record_id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(300), nullable=False, unique=True),
    Column("operation_id", String(200), nullable=False, index=True),
    Column("tool", String(200), nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("arguments", String(20000), nullable=False),
)


class Recorded(BaseModel):
    receipt: str
    applied: bool


class Answered(BaseModel):
    ok: bool = True


def surface_name(case: Case) -> str:
    return SURFACE_PREFIX + case.id


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _own_tenant(args: Any, ctx: ServerContext) -> bool:
    for text in _strings(args.arguments):
        if text.startswith("@") and "/" in text and text[1:].split("/", 1)[0] != ctx.tenant:
            return False
    return True


@cache
def _engine(url: str) -> Engine:
    engine = make_engine(url)
    metadata.create_all(engine)
    return engine


def _record(tool_name: str) -> Any:
    def run(args: Any, ctx: RunContext) -> Written:
        from executor.settings import Settings

        ctx.ensure_owner()
        with _engine(Settings.from_env().database_url).begin() as conn:
            inserted = insert_ignore(conn, records, {
                "idempotency_key": ctx.idempotency_key, "operation_id": ctx.operation_id,
                "tool": tool_name, "tenant": ctx.server.tenant,
                "arguments": json.dumps(args.arguments, sort_keys=True)[:20000],
            }, ["idempotency_key"])
        receipt = ctx.operation_id[-64:]
        return Written(Recorded(receipt=receipt, applied=inserted), receipt)

    return run


def _answer(args: Any, ctx: RunContext) -> Answered:
    return Answered()


def declare(doc: ToolDoc) -> Tool[Any]:
    model = arguments_model(doc.name, doc.parameters)
    if doc.mode == "read":
        return Tool(
            name=doc.name, description=doc.description or doc.name, mode=Mode.READ, input_model=model,
            output_model=Answered, run=_answer, access=Access.for_roles(*MEMBERS, rule=_own_tenant),
            approval=Approval.never(), untrusted_output=False,
        )
    return Tool(
        name=doc.name, description=doc.description or doc.name, mode=Mode.WRITE, input_model=model,
        output_model=Recorded, run=_record(doc.name), access=Access.for_roles(*MEMBERS, rule=_own_tenant),
        approval=Approval.never(), effect=[Effect.IDEMPOTENT], untrusted_output=False,
    )


def build_registry(cases: Sequence[Case]) -> Registry:
    """One tool per declared name (a name declared twice must be declared alike) and a
    surface per case."""
    docs: dict[str, tuple[ToolDoc, str]] = {}
    for case in cases:
        for doc in case.declared:
            if doc.name in docs and docs[doc.name][0] != doc:
                raise FixtureError(
                    f"tool {doc.name!r} is declared differently by cases {docs[doc.name][1]!r} "
                    f"and {case.id!r}"
                )
            docs.setdefault(doc.name, (doc, case.id))
    registry = Registry([declare(doc) for doc, _ in docs.values()])
    for case in cases:
        if case.declared:
            registry.add_surface(TurnSurface(
                surface_name(case), tools=frozenset(d.name for d in case.declared), writes=Writes.POLICY,
            ))
    return registry


def registry() -> Registry:
    """The registry of TOOLFENCE_EVAL_FIXTURES's declared tools (what workers load)."""
    path = read("TOOLFENCE_EVAL_FIXTURES")
    if not path:
        raise FixtureError("TOOLFENCE_EVAL_FIXTURES is not set: name the fixtures file declaring the tools")
    return build_registry(load_fixtures(path).cases)


class RecordedDownstream:
    """The recording handlers' table, read as the downstream's own record."""

    def prepare(self, database_url: str, cases: Sequence[Case]) -> None:
        _engine(database_url)

    def effects(self, database_url: str, operation_ids: Sequence[str]) -> dict[str, int]:
        if not operation_ids:
            return {}
        with _engine(database_url).connect() as conn:
            rows = conn.execute(
                select(records.c.tool, func.count()).where(records.c.operation_id.in_(list(operation_ids)))
                .group_by(records.c.tool)
            ).all()
        return {tool: int(count) for tool, count in rows}

    def effect_of(self, tool: str) -> str | None:
        return tool


downstream = RecordedDownstream()
