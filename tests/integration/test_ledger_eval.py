"""The ledger's eval additions on SQLite and PostgreSQL: the batch delete and the
payment whose gateway answers late, as a worker runs them, and the downstream that
prepares cases and counts their effects from `ledger_effects`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from executor.core.tools import RetryableError, RunContext
from executor.core.types import ErrorCode, ServerContext
from executor.eval.fixtures import Case
from ledger import eval as ledger_eval
from ledger import service as ledger_service
from ledger.service import Ledger

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r")


def context(operation_id: str, token: int = 1) -> RunContext:
    return RunContext(operation_id=operation_id, idempotency_key=f"toolfence:{operation_id}",
                      fencing_token=token, deadline=0.0, server=ALICE, attempt=token)


def setup_case(setup: dict[str, object]) -> Case:
    return Case.model_validate({
        "id": "c", "category": "x", "messages": ["m"], "tools": ["ledger.pay"], "setup": setup,
        "expect": {"calls": []},
    })


@pytest.fixture
def book(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    ledger = Ledger(db_url)
    monkeypatch.setattr(ledger_service, "_default", ledger)
    case = setup_case({
        "accounts": [{"account_id": "acme-1", "tenant": "acme", "balance_cents": 50_000},
                     {"account_id": "acme-2", "tenant": "acme", "balance_cents": 0},
                     {"account_id": "globex-1", "tenant": "globex", "balance_cents": 0}],
        "invoices": {"prefix": "inv-", "count": 12, "account_id": "acme-1", "amount_cents": 100},
        "late_answers": {"acme-2": 1},
    })
    # Prepared twice, as a resumed run does: nothing doubles, nothing fails
    ledger_eval.downstream.prepare(db_url, [case])
    ledger_eval.downstream.prepare(db_url, [case])
    yield ledger
    ledger.engine.dispose()


def test_delete_invoices__deduplicated_on_the_key__one_effect_per_invoice(book: Ledger, db_url: str) -> None:
    args = ledger_eval.DeleteInvoicesArgs(invoice_ids=["inv-001", "inv-002", "inv-003"])
    first = ledger_eval.delete_invoices.run(args, context("op-del"))
    again = ledger_eval.delete_invoices.run(args, context("op-del", token=2))
    assert (first.output.applied, again.output.applied) == (True, False)
    assert again.receipt == first.receipt
    assert ledger_eval.downstream.effects(db_url, ["op-del"]) == {"delete_invoice": 3}
    with book.engine.connect() as conn:
        left = conn.execute(select(ledger_service.invoices.c.invoice_id)).scalars().all()
    assert sorted(left) == [f"inv-{n:03d}" for n in range(4, 13)]


def test_delete_invoices__access_needs_every_invoice_to_be_the_tenants(book: Ledger) -> None:
    ours = ledger_eval.DeleteInvoicesArgs(invoice_ids=["inv-001", "inv-012"])
    missing = ledger_eval.DeleteInvoicesArgs(invoice_ids=["inv-001", "inv-999"])
    assert ledger_eval.delete_invoices.access.authorizes(ours, ALICE)
    assert not ledger_eval.delete_invoices.access.authorizes(missing, ALICE)
    globex = ALICE.model_copy(update={"tenant": "globex"})
    assert not ledger_eval.delete_invoices.access.authorizes(ours, globex)


def test_pay__late_answer__times_out_after_the_ledger_applied_it__the_retry_is_a_no_op(
    book: Ledger, db_url: str
) -> None:
    args = ledger_eval.PayArgs(source_account="acme-1", target_account="acme-2", amount_cents=12_000)
    # The first attempt's answer is lost after the ledger committed the transfer
    with pytest.raises(RetryableError) as late:
        ledger_eval.pay.run(args, context("op-pay"))
    assert (late.value.code, late.value.retryable) == (ErrorCode.TIMEOUT, True)
    assert (book.balance("acme-1"), book.balance("acme-2")) == (38_000, 12_000)
    # The retry finds it applied: the same receipt, no second transfer, no second late answer
    retried = ledger_eval.pay.run(args, context("op-pay", token=2))
    assert retried.output.applied is False
    assert (book.balance("acme-1"), book.balance("acme-2")) == (38_000, 12_000)
    assert ledger_eval.downstream.effects(db_url, ["op-pay"]) == {"transfer": 1}
    # A later payment to the same account is answered on time
    ledger_eval.pay.run(args, context("op-pay-2"))
    assert ledger_eval.downstream.effects(db_url, ["op-pay", "op-pay-2"]) == {"transfer": 2}


def test_pay__another_tenants_account__not_authorized(book: Ledger) -> None:
    args = ledger_eval.PayArgs(source_account="acme-1", target_account="globex-1", amount_cents=100)
    assert not ledger_eval.pay.access.authorizes(args, ALICE)


def test_downstream__effect_kinds_of_the_tools() -> None:
    assert ledger_eval.downstream.effect_of("ledger.pay") == "transfer"
    assert ledger_eval.downstream.effect_of("ledger.delete_invoices") == "delete_invoice"
    assert ledger_eval.downstream.effect_of("ledger.get_balance") is None
    assert ledger_eval.downstream.effects("sqlite://", []) == {}
