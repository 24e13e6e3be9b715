"""The entry points hostile input reaches, each wrapped as one fuzz target: call it
with one input; it returns when the entry point kept its contract and raises
`ContractBroken` (or lets the unexpected exception through) when it did not.

The suite's Hypothesis tests (tests/fuzz/test_fuzz_*.py) and the long atheris
run (`make fuzz`, bench/fuzz/run.py) call the same targets, so a crash either
finds is the same crash.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection, Engine

from executor.core.admission import Admitted, Rejected, admit
from executor.core.approvers import ApproverPolicy
from executor.core.identifiers import InvalidIdentifier
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import (
    ErrorCode,
    FailedTerminal,
    Pending,
    ProposedCall,
    ServerContext,
    Succeeded,
)
from executor.providers import SURFACES, AdapterError
from executor.providers.common import ToolResult
from executor.providers.hosted import HostedPolicy, HostedServer
from tests.fuzz.shapes import CANARY


class ContractBroken(AssertionError):
    """An entry point answered hostile input outside its contract."""


class WeatherArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=100)
    unit: str | None = None


class TimeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timezone: str


class Out(BaseModel):
    value: str = ""


def _never_runs(args: Any, ctx: RunContext) -> Any:
    raise AssertionError("a fuzz target never runs a tool")


def _write(args: Any, ctx: RunContext) -> Written:
    raise AssertionError("a fuzz target never runs a tool")


REGISTRY = Registry(
    [
        Tool(
            name="get_weather",
            description="weather",
            mode=Mode.READ,
            input_model=WeatherArgs,
            output_model=Out,
            run=_never_runs,
            access=Access.public_tool(),
            approval=Approval.never(),
            untrusted_output=False,
        ),
        Tool(
            name="mcp.time/get",
            description="time",
            mode=Mode.READ,
            input_model=TimeArgs,
            output_model=Out,
            run=_never_runs,
            access=Access.public_tool(),
            approval=Approval.never(),
            untrusted_output=True,
        ),
        Tool(
            name="set_alarm",
            description="alarm",
            mode=Mode.WRITE,
            input_model=TimeArgs,
            output_model=Out,
            run=_write,
            access=Access.public_tool(),
            approval=Approval.never(),
            effect=[Effect.IDEMPOTENT],
            untrusted_output=False,
        ),
    ]
)
CONTEXT = ServerContext(
    principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-fuzz"
)


def _adapter_refusal(exc: AdapterError) -> None:
    if exc.unexpected:
        import traceback

        cause = exc.__context__
        where = traceback.extract_tb(cause.__traceback__)[-1] if cause is not None else None
        site = f" at {where.filename}:{where.lineno}" if where is not None else ""
        raise ContractBroken(f"adapter boundary caught an unforeseen error{site}: {exc.message}")


def _result_for(call: ProposedCall, decision: Admitted | Rejected) -> ToolResult:
    if isinstance(decision, Rejected):
        return decision.result
    return Succeeded(call_id=call.call_id, tool_name=call.tool_name, output=decision.arguments_json)


def adapter(surface_name: str, envelope: Any) -> None:
    """read_proposals → admit → write_results, and read_hosted_calls: each returns
    or raises an `AdapterError` its own checks chose (never the boundary's net)."""
    surface = SURFACES[surface_name]
    proposals: list[ProposedCall] | None
    try:
        proposals = surface.read_proposals(envelope, known_names=REGISTRY.names())
    except AdapterError as exc:
        _adapter_refusal(exc)
        proposals = None
    try:
        surface.read_hosted_calls(envelope)
    except AdapterError as exc:
        _adapter_refusal(exc)
    if proposals is None:
        return
    results = [_result_for(call, admit_call(call)) for call in proposals]
    try:
        surface.write_results(proposals, results)
    except AdapterError as exc:
        _adapter_refusal(exc)


def admit_call(call: ProposedCall) -> Admitted | Rejected:
    """admit: a decision for every call, never an exception, never an echo of the canary."""
    decision = admit(call, REGISTRY, CONTEXT)
    if isinstance(decision, Rejected):
        if CANARY in decision.result.error.model_dump_json():
            raise ContractBroken("a rejection echoes the rejected text")
    elif not isinstance(decision, Admitted):
        raise ContractBroken(f"admit returned {type(decision).__name__}")
    return decision


def proposed(value: Any) -> list[ProposedCall] | None:
    """A neutral call list as the CLI and an HTTP intake read it, or None when it is
    not one (refused as a whole)."""
    items = value.get("calls") if isinstance(value, Mapping) else value
    if not isinstance(items, list):
        return None
    calls: list[ProposedCall] = []
    for item in items:
        try:
            calls.append(ProposedCall.model_validate(item))
        except ValueError:
            return None
    return calls


def neutral_calls(value: Any) -> None:
    """A neutral call list: each call admitted or refused, never an exception."""
    for call in proposed(value) or []:
        admit_call(call)


def enqueue_in_rolled_back_transaction(conn: Connection, calls: list[ProposedCall]) -> None:
    """enqueue inside the caller's transaction (begun here on `conn`, which holds
    none, and rolled back after): a status per call, or `InvalidBatch`/
    `InvalidIdentifier` before any write; the caller's own row, written first, is
    still there after. A whole transaction per input, not a savepoint in one long
    one: PostgreSQL keeps a savepoint after ROLLBACK TO, so each input nested one
    level deeper and held one more transaction-id lock, until a long `make fuzz`
    exhausted the server's lock table ("out of shared memory")."""
    from sqlalchemy import text

    from outbox.producer import InvalidBatch, enqueue

    transaction = conn.begin()
    try:
        conn.execute(text("INSERT INTO fuzz_business_rows (note) VALUES ('mine')"))
        try:
            handle = enqueue(conn, calls, CONTEXT, REGISTRY)
        except (InvalidBatch, InvalidIdentifier):
            handle = None
        if handle is not None:
            if [c.call_id for c in handle.calls][: len(calls)] != [c.call_id for c in calls]:
                raise ContractBroken("enqueue lost the correlation of a call")
            for status in (c.status for c in handle.calls):
                if not isinstance(status, Pending | FailedTerminal | Succeeded):
                    raise ContractBroken(f"unexpected status {type(status).__name__}")
                if isinstance(status, FailedTerminal) and status.error.code not in ErrorCode:
                    raise ContractBroken("an error code outside ErrorCode")
        mine = conn.execute(text("SELECT count(*) FROM fuzz_business_rows")).scalar_one()
        if mine < 1:
            raise ContractBroken("the caller's own row is gone")
    finally:
        transaction.rollback()


def cli_input(data: bytes) -> None:
    """The CLI's input-file reader and call-list reader: a value or a `UserError`."""
    import tempfile

    from executor.cli.args import UserError
    from executor.cli.commands.enqueue import neutral_calls as _neutral_calls
    from executor.cli.common import read_json_file as _read_json_file

    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        handle.write(data)
        handle.flush()
        try:
            payload = _read_json_file(handle.name, 32)
            calls = _neutral_calls(payload)
        except UserError:
            return
    for call in calls:
        admit_call(call)


def json_or_none(data: bytes) -> Any:
    """The JSON value of fuzzer bytes, or None when they are not JSON text."""
    try:
        return json.loads(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------- the hosted path

HOSTED_POLICY = HostedPolicy(
    servers=(
        HostedServer(
            label="crm",
            url="https://crm.example/mcp",
            allowed_tools=frozenset({"update_customer", "lookup_customer"}),
            approval_required=frozenset({"update_customer"}),
            approvers=ApproverPolicy.for_roles("support-lead"),
        ),
    ),
    builtin_tools=frozenset({"web_search", "code_execution"}),
)
"""One MCP server with a tool routed to approval (`record_hosted_approval`), one
allowed outright, and two built-in tools allowed: every branch of `_record_hosted`."""

BUSINESS_TABLE = "fuzz_business_rows"


def create_business_table(engine: Engine) -> None:
    """The caller's own table, where each example writes its row before `enqueue`."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {BUSINESS_TABLE} (note TEXT NOT NULL)"))


def hosted_enqueue(engine: Engine, surface_name: str, envelope: Any) -> None:
    """`read_hosted_calls` and `read_proposals` of one envelope, then `enqueue(hosted=…)`
    the way a producer calls it: in its own transaction, after writing its own row,
    committed after. Whatever the envelope holds, enqueue answers a status per call
    or raises `InvalidBatch`/`InvalidIdentifier` (documented to leave the caller's
    transaction as it was), and the caller's row is there once committed. Any other
    exception (a `StoreDatabaseError` aborts the caller's transaction) is a crash."""
    import uuid

    from sqlalchemy import text

    from executor.core.identifiers import InvalidIdentifier
    from executor.store.errors import StoreDatabaseError
    from outbox.producer import HostedCalls, InvalidBatch, enqueue

    surface = SURFACES[surface_name]
    try:
        hosted = surface.read_hosted_calls(envelope)
    except AdapterError as exc:
        _adapter_refusal(exc)
        return
    try:
        proposals = surface.read_proposals(envelope, known_names=REGISTRY.names())
    except AdapterError as exc:
        _adapter_refusal(exc)
        proposals = []
    mark = uuid.uuid4().hex
    context = CONTEXT.model_copy(update={"request_id": f"req-{mark}", "roles": frozenset({"member"})})
    handle = None
    with engine.connect() as conn:
        transaction = conn.begin()
        conn.execute(text(f"INSERT INTO {BUSINESS_TABLE} (note) VALUES (:mark)"), {"mark": mark})
        try:
            handle = enqueue(conn, proposals, context, REGISTRY, hosted=HostedCalls(hosted, HOSTED_POLICY))
        except (InvalidBatch, InvalidIdentifier):
            pass
        except StoreDatabaseError as exc:
            transaction.rollback()
            raise ContractBroken(
                f"enqueue(hosted=...) raised StoreDatabaseError {exc.sqlstate or '-'} {exc.kind}: "
                "the caller's transaction and its row are lost"
            ) from exc
        transaction.commit()
    with engine.connect() as conn:
        mine = conn.execute(
            text(f"SELECT count(*) FROM {BUSINESS_TABLE} WHERE note = :mark"), {"mark": mark}
        ).scalar_one()
    if mine != 1:
        raise ContractBroken("the caller's own row is gone after enqueue(hosted=...) and commit")
    if handle is None:
        return
    if [c.call_id for c in handle.calls][: len(proposals)] != [c.call_id for c in proposals]:
        raise ContractBroken("enqueue lost the correlation of a call")
    for status in (c.status for c in handle.calls):
        if not isinstance(status, Pending | FailedTerminal | Succeeded):
            raise ContractBroken(f"unexpected status {type(status).__name__}")
        if isinstance(status, FailedTerminal):
            if status.error.code not in ErrorCode:
                raise ContractBroken("an error code outside ErrorCode")
            if CANARY in status.error.model_dump_json():
                raise ContractBroken("a hosted call's refusal echoes the provider's text")
