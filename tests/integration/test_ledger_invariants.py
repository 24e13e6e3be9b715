"""The reference ledger keeps its own invariant: no account goes below zero.

Whatever a caller checked before, `transfer` refuses a debit the balance does not
cover in the same transaction as the effect, on SQLite and PostgreSQL, and
concurrent transfers that each fit but together do not cannot both land
(PostgreSQL, real threads). The tool maps the refusal to `business_rule_violation`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from executor.core.tools import RunContext, StaleFencingToken, ToolFailure
from executor.core.types import ErrorCode, ServerContext
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import AccountNotFound, InsufficientFunds, Ledger


@pytest.fixture
def book(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    ledger = Ledger(db_url)
    ledger.create_schema()
    ledger.open_account("src", "acme", 1_000)
    ledger.open_account("dst", "acme", 0)
    monkeypatch.setattr(ledger_service, "_default", ledger)
    yield ledger
    ledger.engine.dispose()


def test_transfer__more_than_the_balance__refused_and_nothing_recorded(book: Ledger) -> None:
    with pytest.raises(InsufficientFunds):
        book.transfer(key="k1", operation_id="op-1", token=1, source="src", target="dst", amount_cents=1_001)

    assert (book.balance("src"), book.balance("dst")) == (1_000, 0)
    assert book.effects_per_operation() == {}
    # The refused key left no dedupe row behind: a later attempt is judged afresh
    applied = book.transfer(key="k1", operation_id="op-1", token=2, source="src", target="dst",
                            amount_cents=1_000)
    assert applied.applied and (book.balance("src"), book.balance("dst")) == (0, 1_000)


def test_transfer_tool__ledger_refuses_overdraft__business_rule_violation_not_retryable(
    book: Ledger,
) -> None:
    args = ledger_tools.TransferArgs(source_account="src", target_account="dst", amount_cents=5_000)
    ctx = RunContext(
        operation_id="op-1", idempotency_key="toolfence:op-1", fencing_token=1, deadline=0.0,
        server=ServerContext(principal="alice", tenant="acme", request_id="r"), attempt=1,
    )

    with pytest.raises(ToolFailure) as refused:
        ledger_tools.transfer.run(args, ctx)

    assert (refused.value.code, refused.value.retryable) == (ErrorCode.BUSINESS_RULE_VIOLATION, False)
    assert refused.value.message == "insufficient funds"


def test_transfer__concurrent_debits_over_the_balance__only_those_that_fit_land(
    pg_url: str,
) -> None:
    # Given 1,000 cents and ten threads each moving 300 at the same moment
    book = Ledger(pg_url)
    book.create_schema()
    book.open_account("src", "acme", 1_000)
    book.open_account("dst", "acme", 0)
    barrier = threading.Barrier(10)
    outcomes: list[str] = []
    lock = threading.Lock()

    def move(n: int) -> None:
        barrier.wait()
        try:
            book.transfer(key=f"k{n}", operation_id=f"op-{n}", token=1, source="src", target="dst",
                          amount_cents=300)
            result = "applied"
        except InsufficientFunds:
            result = "refused"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=move, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    # Then exactly three landed and the balance never went below zero
    assert sorted(outcomes) == ["applied"] * 3 + ["refused"] * 7
    assert (book.balance("src"), book.balance("dst")) == (100, 900)
    assert set(book.effects_per_operation().values()) == {1}
    book.engine.dispose()


def test_transfer__lower_token_after_a_higher_one__refused_recorded_nothing_applied(book: Ledger) -> None:
    applied = book.transfer(key="k1", operation_id="op-1", token=3, source="src", target="dst",
                            amount_cents=100)
    assert applied.applied

    # A zombie of an older generation, after the newer one wrote
    with pytest.raises(StaleFencingToken):
        book.transfer(key="k1", operation_id="op-1", token=2, source="src", target="dst", amount_cents=100)

    # The refusal is recorded (committed before the caller hears of it) and applied nothing
    assert book.fenced_count() == 1
    assert (book.balance("src"), book.balance("dst")) == (900, 100)
    assert book.effects_per_operation() == {"op-1": 1}


def test_transfer__newer_generation_finds_it_applied__same_receipt_fence_raised(book: Ledger) -> None:
    first = book.transfer(key="k1", operation_id="op-1", token=1, source="src", target="dst",
                          amount_cents=100)

    # The next generation (its worker took over) runs it again
    again = book.transfer(key="k1", operation_id="op-1", token=2, source="src", target="dst",
                          amount_cents=100)

    assert (again.receipt, again.applied) == (first.receipt, False)
    assert (book.balance("src"), book.balance("dst")) == (900, 100)
    # The fence moved to 2: the first generation is a zombie now
    with pytest.raises(StaleFencingToken):
        book.transfer(key="k1", operation_id="op-1", token=1, source="src", target="dst", amount_cents=100)


def test_transfer__unknown_target__account_not_found_and_the_debit_rolled_back(book: Ledger) -> None:
    with pytest.raises(AccountNotFound):
        book.transfer(key="k1", operation_id="op-1", token=1, source="src", target="nobody",
                      amount_cents=100)

    assert book.balance("src") == 1_000
    assert book.effects_per_operation() == {}


def test_transfer__unknown_source__account_not_found(book: Ledger) -> None:
    with pytest.raises(AccountNotFound):
        book.transfer(key="k1", operation_id="op-1", token=1, source="nobody", target="dst",
                      amount_cents=100)

    assert book.balance("dst") == 0


def test_reads__the_hooks_lookups__answer_what_exists(book: Ledger) -> None:
    # The tenants of a batch (one statement: an array parameter on PostgreSQL, an
    # expanding IN on SQLite), one account's tenant, a balance
    book.open_account("other", "globex", 5)

    assert book.account_tenants(["src", "other", "missing"]) == {"src": "acme", "other": "globex"}
    assert book.account_tenants([]) == {}
    assert (book.account_tenant("other"), book.account_tenant("missing")) == ("globex", None)
    assert book.balance("other") == 5
    with pytest.raises(AccountNotFound):
        book.balance("missing")
