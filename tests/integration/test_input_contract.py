"""The producer's input contract on SQLite and PostgreSQL: a hostile identifier is
a per-call `invalid_identifier` result (or, request-level, an exception raised
before any write), never an error that unwinds the caller's transaction, and the
argument limits come from the settings.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, text

from executor import settings
from executor.core.identifiers import InvalidIdentifier
from executor.core.tools import Access, Approval, Effect, Mode, Registry, RunContext, Tool, Written
from executor.core.types import ErrorCode, FailedTerminal, Pending, ProposedCall, ServerContext
from outbox.producer import enqueue
from outbox.results import results

CANARY = "sk-canaryCANARYcanary0123456789"


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class Out(BaseModel):
    text: str


def _write(args: NoteArgs, ctx: RunContext) -> Written:
    return Written(Out(text=args.text), receipt=f"r-{ctx.operation_id}")


REGISTRY = Registry([
    Tool(
        name="notes.write", description="write a note", mode=Mode.WRITE, input_model=NoteArgs,
        output_model=Out, run=_write, access=Access.public_tool(), untrusted_output=False,
        approval=Approval.never(), effect=[Effect.IDEMPOTENT], repeatable=True,
    ),
])


def _ctx(request_id: str = "req-1", **changes: str) -> ServerContext:
    values: dict[str, str] = {"principal": "alice", "tenant": "acme", "request_id": request_id} | changes
    return ServerContext(roles=frozenset({"member"}), **values)


def _good(call_id: str) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name="notes.write", arguments=f'{{"text": "{CANARY}"}}')


# Every way an identifier can break a database or a terminal, as a model writes it.
BAD_IDENTIFIERS = [
    pytest.param("x" * 201, id="over_200_chars"),
    pytest.param("call\x00id", id="nul"),
    pytest.param("call\ud800id", id="lone_surrogate"),
    pytest.param("call\nid", id="line_break"),
    pytest.param("call\x1b[31mid", id="terminal_escape"),
    pytest.param("\u202ecall", id="bidi_override"),
]


@pytest.fixture
def business_table(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE business_rows (note TEXT NOT NULL)"))
    return engine


@pytest.mark.parametrize("bad", BAD_IDENTIFIERS)
@pytest.mark.parametrize("field", ["call_id", "tool_name"])
def test_enqueue__bad_call_identifier__terminal_for_that_call_and_caller_rows_survive(
    business_table: Engine, field: str, bad: str
) -> None:
    engine = business_table
    bad_call = ProposedCall(
        call_id=bad if field == "call_id" else "call_bad",
        tool_name=bad if field == "tool_name" else "notes.write",
        arguments=f'{{"text": "{CANARY}"}}',
    )
    # Given the caller's own row and valid calls around one call with a bad identifier,
    # all in the caller's one transaction
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO business_rows VALUES ('order 42')"))
        handle = enqueue(conn, [_good("call_1"), bad_call, _good("call_3")], _ctx(), REGISTRY)
        conn.execute(text("INSERT INTO business_rows VALUES ('after enqueue')"))

    # Then the bad call ended invalid_identifier, naming the field and never the value
    statuses = {h.call_id: h.status for h in handle.calls}
    refused = statuses[bad_call.call_id]
    assert isinstance(refused, FailedTerminal)
    assert refused.error.code is ErrorCode.INVALID_IDENTIFIER
    assert [d.path for d in refused.error.details] == [field]
    assert bad not in refused.error.model_dump_json()
    # And the valid calls are admitted, in the committed transaction with the caller's rows
    assert isinstance(statuses["call_1"], Pending)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT note FROM business_rows ORDER BY note")).scalars().all()
    assert rows == ["after enqueue", "order 42"]
    stored = results(engine, _ctx())
    assert [s.call_id for s in stored] == ["call_1", bad_call.call_id, "call_3"]
    assert stored[1].model_dump() == refused.model_dump()
    if field == "call_id":
        # A refused write blocks the later writes of its request, as any refusal does
        assert isinstance(stored[2], FailedTerminal)
        assert stored[2].error.code is ErrorCode.PREDECESSOR_FAILED
    else:
        # An unknown (unstorable) tool name is no write: the later write is admitted
        assert isinstance(stored[2], Pending)


def test_enqueue__bad_call_id_enqueued_again__same_answer_nothing_new(engine: Engine) -> None:
    # Given a call whose id cannot be stored, enqueued once
    bad = ProposedCall(call_id="c\x00" * 150, tool_name="notes.write", arguments='{"text": "a"}')
    with engine.begin() as conn:
        first = enqueue(conn, [bad], _ctx(), REGISTRY)
    # When the same request is enqueued again
    with engine.begin() as conn:
        again = enqueue(conn, [bad], _ctx(), REGISTRY)
    # Then it gets the same answer from its stored row, and no second row appears
    assert again.calls[0].status.model_dump() == first.calls[0].status.model_dump()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM toolfence_calls")).scalar_one() == 1


def test_enqueue__bad_chosen_operation_id__terminal_for_that_call(engine: Engine) -> None:
    with engine.begin() as conn:
        handle = enqueue(
            conn, [_good("call_1"), _good("call_2")], _ctx(), REGISTRY,
            operation_ids={"call_2": "op\x00" + CANARY},
        )
    second = handle.calls[1].status
    assert isinstance(handle.calls[0].status, Pending)
    assert isinstance(second, FailedTerminal) and second.error.code is ErrorCode.INVALID_IDENTIFIER
    assert [d.path for d in second.error.details] == ["operation_id"]
    assert CANARY not in second.model_dump_json()


@pytest.mark.parametrize("bad", BAD_IDENTIFIERS)
@pytest.mark.parametrize("field", ["request_id", "tenant", "principal", "conversation_id"])
def test_enqueue__bad_request_identifier__raises_before_any_write_caller_rows_survive(
    business_table: Engine, field: str, bad: str
) -> None:
    engine = business_table
    # Given the caller's own row and a valid request already enqueued in its transaction
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO business_rows VALUES ('order 42')"))
        enqueue(conn, [_good("call_1")], _ctx("req-ok"), REGISTRY)
        # When a request with a bad request-level identifier is enqueued in it
        with pytest.raises(InvalidIdentifier) as raised:
            enqueue(conn, [_good("call_2")], _ctx(**({"request_id": "req-bad"} | {field: bad})), REGISTRY)
        # Then the exception names the field, never the value, and the transaction
        # is still usable: the caller goes on and commits
        assert raised.value.field.value == field
        assert bad not in str(raised.value)
        conn.execute(text("INSERT INTO business_rows VALUES ('after refusal')"))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT note FROM business_rows ORDER BY note")).scalars().all()
        calls = conn.execute(text("SELECT request_id FROM toolfence_calls")).scalars().all()
    assert rows == ["after refusal", "order 42"]
    assert calls == ["req-ok"]


def test_enqueue__argument_limits_from_settings__oversized_call_refused(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given settings that allow 50 bytes of arguments, nested 1 deep
    monkeypatch.setenv("TOOLFENCE_MAX_ARGUMENT_BYTES", "50")
    monkeypatch.setenv("TOOLFENCE_MAX_ARGUMENT_DEPTH", "1")
    big = ProposedCall(call_id="big", tool_name="notes.write", arguments='{"text": "' + "a" * 200 + '"}')
    small = ProposedCall(call_id="small", tool_name="notes.write", arguments='{"text": "a"}')
    # When a 200-byte call and a small one are enqueued without explicit limits
    # (under the settings read again: a process reads its settings once)
    with settings.using(settings.Settings.from_env()), engine.begin() as conn:
        handle = enqueue(conn, [small, big], _ctx(), REGISTRY)
    # Then the settings' byte limit refuses the big one
    refused = handle.calls[1].status
    assert isinstance(handle.calls[0].status, Pending)
    assert isinstance(refused, FailedTerminal) and refused.error.code is ErrorCode.INVALID_ARGUMENTS_JSON
    assert refused.error.details[0].code == "too_large"
