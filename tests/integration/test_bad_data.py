"""A value the database refuses is an answer, not a lost connection (decision 0193).

Classified by SQLSTATE class: 08 and the driver's connection-level errors are
transient (the call is not answered; it is tried again), 22 and 23 are bad data
(only that call is refused `invalid_arguments`, detail `refused_by_database`). On
real PostgreSQL, through the real producer (`enqueue`) and the real worker
(`OperationRunner` in process), with the reference ledger: its access rule looks
the account's tenant up, so `{"account_id": "acme-1\\u0000"}` makes psycopg raise
`DataError` in the hook; its `send_notice` is an `unsafe` write. SQLite holds a NUL
character, so there the call is an ordinary unknown account.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from paykit import Paid, PayArgs
from sqlalchemy import Engine, create_engine, func, select, text

from executor.core.tools import Access, Approval, Mode, Registry, Tool
from executor.core.types import FailedTerminal, ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.schema import calls, operations
from executor.worker.outcomes import OutcomeLabel
from executor.worker.runner import OperationRunner
from ledger import service as ledger_service
from ledger.service import Ledger
from ledger.tools import registry as ledger_registry
from outbox.producer import AdmissionUnavailable, enqueue
from outbox.results import results

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-1")
REFUSED = {"path": "", "code": "refused_by_database", "expected": "values the database can hold"}


@pytest.fixture
def ledger(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    book = Ledger(db_url)
    monkeypatch.setattr(ledger_service, "_default", book)
    book.create_schema()
    book.open_account("acme-1", "acme", 10_000)
    book.open_account("acme-2", "acme", 0)
    yield book
    book.engine.dispose()


def _call(call_id: str, tool: str, **arguments: Any) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=f"ledger.{tool}", arguments=arguments)


def _runner(db_url: str, registry: Registry, engine: Engine) -> OperationRunner:
    return OperationRunner(Settings(database_url=db_url, broker_url="memory://"), registry, engine)


def test_enqueue__nul_in_an_account_id__only_that_call_is_refused_the_batch_admitted(
    engine: Engine, db_url: str, ledger: Ledger
) -> None:
    batch = [
        _call("c-read", "get_balance", account_id="acme-1"),
        _call("c-bad", "get_balance", account_id="acme-1\u0000"),
        _call("c-credit", "credit", account_id="acme-2", amount_cents=5),
    ]
    # When a batch with one NUL-bearing account id is enqueued (twice: a retry of the request)
    for _ in range(2):
        with engine.begin() as conn:
            handle = enqueue(conn, batch, ALICE, ledger_registry)
        # Then the innocent calls are admitted and the bad one alone is refused
        read, bad, credit = handle.calls
        assert (read.status.status, credit.status.status) == ("pending", "pending")
        assert isinstance(bad.status, FailedTerminal)
        if engine.dialect.name == "postgresql":
            # The database refused the value (psycopg's DataError): a stable code, no text
            assert bad.status.error.code == "invalid_arguments"
            assert [d.model_dump() for d in bad.status.error.details] == [REFUSED]
        else:
            # SQLite holds the NUL: an account nobody owns
            assert bad.status.error.code == "permission_denied"
        assert "\u0000" not in bad.status.model_dump_json()
    # And the innocent calls run
    runner = _runner(db_url, ledger_registry, engine)
    for handled in (read, credit):
        assert handled.operation_id is not None
        assert runner.handle(handled.operation_id).label is OutcomeLabel.SUCCEEDED
    assert ledger.balance("acme-2") == 5


def test_worker__send_notice_with_nul_text__fails_terminal_and_nothing_was_sent(
    pg_engine: Engine, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = Ledger(pg_url)
    monkeypatch.setattr(ledger_service, "_default", book)
    book.create_schema()
    book.open_account("acme-1", "acme", 0)
    try:
        # Given an admitted unsafe write whose text holds a NUL (the account is innocent)
        with pg_engine.begin() as conn:
            [handle] = enqueue(
                conn, [_call("c-notice", "send_notice", account_id="acme-1", text="hi\u0000there")],
                ALICE, ledger_registry,
            ).calls
        assert handle.status.status == "pending" and handle.operation_id is not None
        # When the worker runs it
        outcome = _runner(pg_url, ledger_registry, pg_engine).handle(handle.operation_id)
        # Then it failed for good with a stable code, not reconciliation_pending
        assert outcome.label is OutcomeLabel.FAILED_TERMINAL
        [status] = results(pg_engine, "acme", "req-1")
        assert isinstance(status, FailedTerminal)
        assert status.error.code == "invalid_arguments"
        assert [d.model_dump() for d in status.error.details] == [REFUSED]
        # And the ledger wrote nothing: no notice, no effect
        assert book.effects_per_operation() == {}
        with book.engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(ledger_service.notices)).scalar_one() == 0
    finally:
        book.engine.dispose()


# ------------------------------------------------------------- a hook at execution


@dataclass
class Probe:
    """An access rule that asks PostgreSQL about the call's value once `strict`:
    `SELECT CAST(:v AS integer)` (22P02 for text that is no number, psycopg's own
    DataError for a NUL)."""

    url: str
    strict: bool = False
    runs: list[str] = field(default_factory=list)
    engine: Engine | None = None

    def authorizes(self, args: PayArgs, ctx: ServerContext) -> bool:
        if not self.strict:
            return True
        with self._engine().connect() as conn:
            conn.execute(text("SELECT CAST(:v AS integer)"), {"v": args.account})
        return True

    def _engine(self) -> Engine:
        if self.engine is None:
            # The tool's own engine, no idle ping: a dead connection is found by the query.
            self.engine = create_engine(self.url, pool_size=1, max_overflow=0)
        return self.engine

    def backend_pid(self) -> int:
        with self._engine().connect() as conn:
            return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())

    def tool(self) -> Tool[PayArgs]:
        def run(args: PayArgs, ctx: Any) -> Paid:
            self.runs.append(ctx.operation_id)
            return Paid(receipt="quote")

        return Tool(
            name="bank.quote", description="quote", mode=Mode.READ, untrusted_output=False,
            input_model=PayArgs, output_model=Paid, run=run,
            access=Access.for_roles("member", rule=self.authorizes), approval=Approval.never(),
        )


@pytest.fixture
def probe(pg_url: str) -> Iterator[Probe]:
    found = Probe(pg_url)
    yield found
    if found.engine is not None:
        found.engine.dispose()


def _quote(call_id: str, account: str) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name="bank.quote", arguments={"account": account, "amount": 5})


@pytest.mark.parametrize("account", ["12\u0000", "not-a-number"], ids=["nul", "sqlstate-22P02"])
def test_worker__recheck_rule_meets_a_refused_value__refused_at_execution_not_given_back(
    pg_engine: Engine, pg_url: str, probe: Probe, account: str
) -> None:
    registry = Registry([probe.tool()])
    # Given a call admitted while its rule did not look the value up
    with pg_engine.begin() as conn:
        [handle] = enqueue(conn, [_quote("c-q", account)], ALICE, registry).calls
    assert handle.operation_id is not None
    # When the rule, at execution, sends the value to a database that refuses it
    probe.strict = True
    outcome = _runner(pg_url, registry, pg_engine).handle(handle.operation_id)
    # Then the call is refused for good with the stable code, and the handler never ran
    assert outcome.label is OutcomeLabel.FAILED_TERMINAL, outcome
    [status] = results(pg_engine, "acme", "req-1")
    assert isinstance(status, FailedTerminal)
    assert status.error.code == "invalid_arguments"
    assert [d.model_dump() for d in status.error.details] == [REFUSED]
    assert probe.runs == []


def _terminate(pg_url: str, pid: int) -> None:
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


def test_lost_connection__pg_terminate_backend__is_still_transient_at_admission_and_execution(
    pg_engine: Engine, pg_url: str, probe: Probe
) -> None:
    registry = Registry([probe.tool()])
    probe.strict = True
    # Given the rule's pooled connection is killed by the server (pg_terminate_backend)
    _terminate(pg_url, probe.backend_pid())
    # When a batch needing the rule is enqueued
    with pytest.raises(AdmissionUnavailable), pg_engine.begin() as conn:
        enqueue(conn, [_quote("c-1", "1")], ALICE, registry)
    # Then nothing is answered (retry the request), and the retry is admitted
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(calls)).scalar_one() == 0
    with pg_engine.begin() as conn:
        [handle] = enqueue(conn, [_quote("c-1", "1")], ALICE, registry).calls
    assert handle.status.status == "pending" and handle.operation_id is not None
    # And at execution, a killed connection gives the operation back to try again
    _terminate(pg_url, probe.backend_pid())
    outcome = _runner(pg_url, registry, pg_engine).handle(handle.operation_id)
    assert outcome.label is OutcomeLabel.RETRY_WAIT, outcome
    with pg_engine.connect() as conn:
        assert conn.execute(select(operations.c.state)).scalar_one() == "retry_wait"
    assert probe.runs == []
