"""The workload: scripted scenarios and random requests over two tenants."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from executor.cli.demo.constants import WAVES
from executor.core.types import (
    ProposedCall,
    ServerContext,
)

TENANTS: dict[str, dict[str, int]] = {
    "acme": {
        "acme-operating": 25_000_000,
        "acme-payroll": 5_000_000,
        "acme-reserve": 0,
        "acme-vendors": 1_000_000,
    },
    "globex": {
        "globex-main": 8_000_000,
        "globex-savings": 2_000_000,
        "globex-vendors": 0,
    },
}
# Opened beside TENANTS' accounts but never used by the random requests, so the one
# scenario that spends it knows its balance: 400.00.
PETTY_CASH = ("acme-petty", "acme", 40_000)
PRINCIPALS = {"acme": "alice@acme", "globex": "bob@globex"}


@dataclass(frozen=True)
class DemoRequest:
    request_id: str
    tenant: str
    kind: str
    calls: tuple[ProposedCall, ...]

    @property
    def context(self) -> ServerContext:
        return ServerContext(
            principal=PRINCIPALS[self.tenant], tenant=self.tenant, roles=frozenset({"member"}),
            request_id=self.request_id,
        )


class _Calls:
    """Builds one request's calls the way a model writes them: JSON text per call."""

    def __init__(self) -> None:
        self.items: list[ProposedCall] = []

    def add(self, tool: str, arguments: str | Mapping[str, Any]) -> None:
        raw = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
        self.items.append(
            ProposedCall(call_id=f"call_{len(self.items) + 1}", tool_name=tool, arguments=raw)
        )

    def balance(self, account: str) -> None:
        self.add("ledger.get_balance", {"account_id": account})

    def credit(self, account: str, cents: int, memo: str = "") -> None:
        self.add("ledger.credit", {"account_id": account, "amount_cents": cents, "memo": memo})

    def transfer(self, source: str, target: str, cents: int) -> None:
        self.add(
            "ledger.transfer",
            {"source_account": source, "target_account": target, "amount_cents": cents},
        )

    def invoice(self, account: str, cents: int) -> None:
        self.add("ledger.create_invoice", {"account_id": account, "amount_cents": cents})

    def notice(self, account: str, message: str) -> None:
        self.add("ledger.send_notice", {"account_id": account, "text": message})


def _other_tenant(tenant: str) -> str:
    return "globex" if tenant == "acme" else "acme"


def _accounts(tenant: str) -> list[str]:
    return list(TENANTS[tenant])


def _vendors(tenant: str) -> str:
    return f"{tenant}-vendors"


def _funded(tenant: str) -> str:
    return "acme-operating" if tenant == "acme" else "globex-main"


def _scenario_requests() -> list[tuple[str, str, _Calls]]:
    """The requests every run has: approvals, and each gate's refusal."""
    approved = _Calls()
    approved.balance("acme-reserve")
    approved.transfer("acme-operating", "acme-reserve", 75_000)  # ≥ 50,000: needs approval
    approved.balance("acme-reserve")  # placed after the transfer: sees it
    approved.notice("acme-reserve", "Reserve topped up by 750.00")
    denied = _Calls()
    denied.transfer("globex-main", "globex-savings", 150_000)  # a person will deny it
    denied.notice("globex-savings", "Savings transfer done")  # never runs: predecessor failed
    mistakes = _Calls()
    mistakes.balance("acme-operating")
    mistakes.add("ledger.delete_account", {"account_id": "acme-payroll"})  # allowlist: unknown tool
    mistakes.balance("globex-main")  # authorization: another tenant's account
    mistakes.add("ledger.credit", '{"account_id": "acme-payroll", "amount_cents": 1200')  # parse
    mistakes.add(  # schema: extra field, negative amount
        "ledger.credit", {"account_id": "acme-payroll", "amount_cents": -500, "override": True}
    )
    mistakes.notice("acme-payroll", "Payroll adjusted")  # ordering: an earlier write was refused
    repeated = _Calls()
    repeated.credit("acme-payroll", 12_000, "bonus")
    repeated.credit("acme-payroll", 12_000, "bonus")  # the same write again: reused, not run twice
    repeated.balance("acme-payroll")
    looping = _Calls()  # a model in a loop: the ninth read of one tool is over the request's budget
    for _ in range(10):
        looping.balance("globex-main")
    # Two transfers from 400.00 of petty cash: at admission each fits the balance, so
    # both are admitted; they run in order, and the worker's re-check of the second
    # finds 100.00 left: refused at execution, no downstream call.
    stale = _Calls()
    stale.transfer(PETTY_CASH[0], "acme-reserve", 30_000)
    stale.transfer(PETTY_CASH[0], "acme-reserve", 25_000)
    return [
        ("approval", "acme", approved), ("approval", "globex", denied), ("mistakes", "acme", mistakes),
        ("repeated", "acme", repeated), ("budget", "globex", looping), ("stale_facts", "acme", stale),
    ]


def _random_request(rng: random.Random, tenant: str) -> tuple[str, _Calls]:
    """One request as a model might propose it. A notice comes last in its request,
    after the work it announces: the one the demo kills a worker in ends
    `reconciliation_pending` with nothing of its request left waiting behind it."""
    batch = _Calls()
    accounts = _accounts(tenant)
    kind = rng.choices(
        ["lookup", "pay_vendor", "top_up", "month_end", "mistakes"], weights=[25, 25, 20, 15, 15]
    )[0]
    if kind == "lookup":  # parallel reads
        for account in rng.sample(accounts, rng.randint(2, len(accounts))):
            batch.balance(account)
    elif kind == "pay_vendor":  # one write per effect contract, in order, then a read that sees them
        cents = rng.randrange(1_000, 20_000, 100)
        batch.balance(_funded(tenant))
        batch.transfer(_funded(tenant), _vendors(tenant), cents)
        batch.invoice(_vendors(tenant), cents)
        batch.balance(_vendors(tenant))
        batch.notice(_vendors(tenant), f"Payment of {cents / 100:.2f} sent")
    elif kind == "top_up":
        first, second = rng.sample(accounts, 2)
        batch.credit(first, rng.randrange(500, 30_000, 50), "top-up")
        batch.credit(second, rng.randrange(500, 30_000, 50), "top-up")
        batch.balance(first)
    elif kind == "month_end":
        account = rng.choice(accounts)
        batch.invoice(account, rng.randrange(1_000, 40_000, 100))
        batch.invoice(account, rng.randrange(1_000, 40_000, 100))
        batch.balance(account)
        batch.notice(account, "Your monthly statement is ready")
    else:  # a read, then one thing a model gets wrong
        batch.balance(rng.choice(accounts))
        mistake = rng.choice(["unknown_tool", "bad_json", "schema", "other_tenant", "overdraft"])
        if mistake == "unknown_tool":
            batch.add("ledger.refund_all", {"account_id": rng.choice(accounts)})
        elif mistake == "bad_json":
            batch.add("ledger.get_balance", "{'account_id': '" + rng.choice(accounts) + "'}")
        elif mistake == "schema":
            batch.add("ledger.credit", {"account_id": rng.choice(accounts), "amount_cents": "lots"})
        elif mistake == "other_tenant":
            batch.balance(rng.choice(_accounts(_other_tenant(tenant))))
        else:
            batch.transfer(_vendors(tenant), _funded(tenant), 9_000_000)  # more than it holds
    return kind, batch


def build_workload(total_calls: int, seed: int = 7) -> list[DemoRequest]:
    """Exactly `total_calls` proposed calls: the scenario requests, then seeded random ones."""
    rng = random.Random(seed)
    requests: list[DemoRequest] = []
    planned = [(kind, tenant, batch) for kind, tenant, batch in _scenario_requests()]
    used = 0
    number = 0
    while used < total_calls:
        if planned:
            kind, tenant, batch = planned.pop(0)
        else:
            tenant = rng.choice(["acme", "acme", "globex"])
            kind, batch = _random_request(rng, tenant)
        items = batch.items[: total_calls - used]
        number += 1
        requests.append(DemoRequest(f"req-{tenant}-{number:04d}", tenant, kind, tuple(items)))
        used += len(items)
    return requests


def split_waves(requests: Sequence[DemoRequest]) -> list[list[DemoRequest]]:
    """Three waves by call count: before the kill, before the pause, after the pause."""
    total = sum(len(r.calls) for r in requests)
    waves: list[list[DemoRequest]] = [[] for _ in WAVES]
    bounds = [sum(WAVES[: i + 1]) * total for i in range(len(WAVES))]
    seen = 0
    for request in requests:
        index = next((i for i, bound in enumerate(bounds) if seen < bound), len(WAVES) - 1)
        waves[index].append(request)
        seen += len(request.calls)
    return waves


# ---------------------------------------------------------------------- watching the fleet
