"""The campaign's producers: closed-loop clients enqueueing requests and awaiting results.

Each client thread builds a request of one to four proposed calls — reads
(`ledger.get_balance`) and writes of every effect contract (`credit` idempotent,
`transfer` fenced, `create_invoice` lookup, `send_notice` unsafe) — plus, now and
then, a call admission must reject (unknown tool, bad JSON, bad arguments,
another tenant's account, a business rule). It enqueues the request in its own
transaction, records what admission said, waits until every call is settled (or
a timeout), records the results, and starts the next. Closed loop: the backlog
is bounded by the number of clients, so the fleet can drain it quickly once
the faults stop.

The producer talks to PostgreSQL directly, and PostgreSQL restarts under it: a
commit that fails with a connection error is ambiguous, so the client asks the
calls table whether the request landed before it retries (a retry of a committed
request would be refused by the calls table's primary key anyway).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DBAPIError, OperationalError

from executor.core.admission import AdmissionUnavailable
from executor.core.states import SETTLED
from executor.core.tools import Registry
from executor.core.types import (
    FailedRetryable,
    FailedTerminal,
    Pending,
    ProposedCall,
    ServerContext,
)
from executor.store.errors import StoreDatabaseError
from executor.store.schema import calls as calls_table
from executor.store.schema import operations
from outbox.producer import enqueue
from outbox.results import request_exists, results, settled
from tests.chaos.history import History

SETTLED_VALUES = tuple(s.value for s in SETTLED)
WRITE_TOOLS = ("ledger.credit", "ledger.transfer", "ledger.create_invoice", "ledger.send_notice")
READ_TOOL = "ledger.get_balance"
ALL_TOOLS = (READ_TOOL, *WRITE_TOOLS)


@dataclass(frozen=True)
class Tenant:
    name: str
    accounts: tuple[str, ...]

    @property
    def principal(self) -> str:
        return f"user-{self.name}"


def make_tenants(count: int = 4, accounts: int = 4) -> list[Tenant]:
    return [
        Tenant(f"t{i}", tuple(f"t{i}-acct-{j}" for j in range(accounts))) for i in range(count)
    ]


OPENING_BALANCE_CENTS = 10**12


class RequestBuilder:
    """Random but reproducible requests (one RNG per client)."""

    def __init__(self, rng: random.Random, tenants: list[Tenant], reject_rate: float) -> None:
        self.rng = rng
        self.tenants = tenants
        self.reject_rate = reject_rate

    def _call(self, index: int, tool: str, arguments: Any) -> ProposedCall:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return ProposedCall(call_id=f"c{index}", tool_name=tool, arguments=text)

    def _valid(self, index: int, tool: str, tenant: Tenant) -> ProposedCall:
        account = self.rng.choice(tenant.accounts)
        amount = self.rng.randint(1, 40_000)  # below the transfer approval threshold
        if tool == READ_TOOL:
            return self._call(index, tool, {"account_id": account})
        if tool == "ledger.credit":
            return self._call(index, tool, {"account_id": account, "amount_cents": amount})
        if tool == "ledger.transfer":
            target = self.rng.choice([a for a in tenant.accounts if a != account])
            return self._call(
                index, tool,
                {"source_account": account, "target_account": target, "amount_cents": amount},
            )
        if tool == "ledger.create_invoice":
            return self._call(index, tool, {"account_id": account, "amount_cents": amount})
        return self._call(index, tool, {"account_id": account, "text": f"notice {uuid.uuid4().hex[:8]}"})

    def _rejected(self, index: int, tenant: Tenant) -> ProposedCall:
        other = self.rng.choice([t for t in self.tenants if t is not tenant])
        kind = self.rng.choice(["unknown_tool", "json", "arguments", "permission", "business_rule"])
        if kind == "unknown_tool":
            return self._call(index, "ledger.drop_tables", {"account_id": tenant.accounts[0]})
        if kind == "json":
            return self._call(index, "ledger.credit", '{"account_id": "x", "amount_cents": ')
        if kind == "arguments":
            return self._call(index, "ledger.credit", {"account_id": tenant.accounts[0], "amount_cents": -5})
        if kind == "permission":
            tool = self.rng.choice([READ_TOOL, "ledger.credit", "ledger.send_notice"])
            return self._valid(index, tool, other)
        account = tenant.accounts[0]
        return self._call(
            index, "ledger.transfer",
            {"source_account": account, "target_account": account, "amount_cents": 10},
        )

    def build(self) -> tuple[Tenant, list[ProposedCall]]:
        tenant = self.rng.choice(self.tenants)
        size = self.rng.choices([1, 2, 3, 4], weights=[3, 3, 2, 2])[0]
        calls = []
        for index in range(size):
            if self.rng.random() < self.reject_rate:
                calls.append(self._rejected(index, tenant))
                continue
            tool = self.rng.choices(ALL_TOOLS, weights=[3, 2, 2, 2, 2])[0]
            calls.append(self._valid(index, tool, tenant))
        return tenant, calls


def _status_fields(status: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"status": status.status, "tool": status.tool_name}
    if isinstance(status, Pending):
        fields["state"] = status.state
    if isinstance(status, FailedTerminal | FailedRetryable):
        fields["code"] = status.error.code.value
    if getattr(status, "operation_id", None):
        fields["operation_id"] = status.operation_id
    return fields


class Workload:
    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        history: History,
        tenants: list[Tenant],
        *,
        clients: int,
        seed: int,
        reject_rate: float = 0.05,
        result_timeout: float = 20.0,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.history = history
        self.tenants = tenants
        self.clients = clients
        self.seed = seed
        self.reject_rate = reject_rate
        self.result_timeout = result_timeout
        self._stop = threading.Event()  # no new requests
        self._abandon = threading.Event()  # stop waiting for results too
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.requests = 0
        self.calls = 0
        self.admitted = 0
        self.ambiguous_enqueues = 0
        self.enqueue_errors = 0
        self.request_ids: list[str] = []

    def start(self) -> None:
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, args=(index,), name=f"client-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, *, abandon: bool = True) -> None:
        self._stop.set()
        if abandon:
            self._abandon.set()

    def join(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    # ------------------------------------------------------------------ one client

    def _client(self, index: int) -> None:
        builder = RequestBuilder(random.Random(self.seed * 1000 + index), self.tenants, self.reject_rate)
        sequence = 0
        while not self._stop.is_set():
            sequence += 1
            tenant, calls = builder.build()
            request_id = f"req-{self.seed}-{index}-{sequence}"
            context = ServerContext(
                principal=tenant.principal, tenant=tenant.name, roles=frozenset({"member"}),
                request_id=request_id,
            )
            admitted = self._enqueue(request_id, calls, context)
            if admitted is None:
                continue
            self._await_results(context, admitted)

    def _enqueue(
        self, request_id: str, calls: list[ProposedCall], context: ServerContext
    ) -> list[dict[str, Any]] | None:
        proposals = {c.call_id: c.tool_name for c in calls}
        for attempt in range(200):
            if self._abandon.is_set():
                return None
            try:
                with self.engine.begin() as conn:
                    handle = enqueue(conn, calls, context, self.registry)
                admitted = [
                    {"call_id": c.call_id, "tool": c.tool_name, "operation_id": c.operation_id,
                     **_status_fields(c.status)}
                    for c in handle.calls
                ]
                break
            except (OperationalError, DBAPIError, StoreDatabaseError, AdmissionUnavailable):
                # Did the commit land before the connection failed? Ask until we can.
                # (AdmissionUnavailable: a tool's access rule or check could not reach
                # what it reads, and nothing was recorded; the request is tried again.)
                landed = self._request_landed(context)
                if landed is None:
                    return None
                if landed:
                    with self._lock:
                        self.ambiguous_enqueues += 1
                    self.history.add("enqueue_ambiguous", request_id=request_id, landed=True)
                    admitted = self._read_back(context)
                    break
                with self._lock:
                    self.enqueue_errors += 1
                time.sleep(min(1.0, 0.05 * (attempt + 1)))
        else:
            return None
        with self._lock:
            self.requests += 1
            self.calls += len(admitted)
            self.admitted += sum(1 for a in admitted if a.get("operation_id") and a["status"] == "pending")
            self.request_ids.append(request_id)
        for entry in admitted:
            self.history.add(
                "admission", tenant=context.tenant, request_id=request_id,
                proposed_tool=proposals[entry["call_id"]], **entry,
            )
        return admitted

    def _request_landed(self, context: ServerContext) -> bool | None:
        while not self._abandon.is_set():
            try:
                with self.engine.connect() as conn:
                    return request_exists(conn, context.tenant, context.request_id)
            except (OperationalError, DBAPIError, StoreDatabaseError):
                time.sleep(0.2)
        return None

    def _read_back(self, context: ServerContext) -> list[dict[str, Any]]:
        while True:
            try:
                with self.engine.connect() as conn:
                    rows = conn.execute(
                        select(calls_table).where(
                            calls_table.c.tenant == context.tenant,
                            calls_table.c.request_id == context.request_id,
                        )
                        .order_by(calls_table.c.position)
                    ).all()
                break
            except (OperationalError, DBAPIError, StoreDatabaseError):
                time.sleep(0.2)
        admitted = []
        for row in rows:
            entry: dict[str, Any] = {"call_id": row.call_id, "tool": row.tool_name,
                                     "operation_id": row.operation_id}
            if row.result:
                stored = json.loads(row.result)
                entry |= {"status": stored.get("status"), "code": (stored.get("error") or {}).get("code")}
            else:
                entry |= {"status": "pending"}
            admitted.append(entry)
        return admitted

    def _await_results(self, context: ServerContext, admitted: list[dict[str, Any]]) -> None:
        request_id = context.request_id
        if all(a["status"] != "pending" for a in admitted):
            return  # every call was decided at admission
        started = time.monotonic()
        deadline = started + self.result_timeout
        statuses: list[Any] = []
        while not self._abandon.is_set() and time.monotonic() < deadline:
            try:
                # One cheap count per poll; the full results only once it reaches zero.
                with self.engine.connect() as conn:
                    open_count = conn.execute(
                        select(func.count()).select_from(operations).where(
                            operations.c.tenant == context.tenant,
                            operations.c.request_id == request_id,
                            operations.c.state.not_in(SETTLED_VALUES),
                        )
                    ).scalar_one()
                if open_count:
                    time.sleep(0.15)
                    continue
                statuses = results(self.engine, context)
            except (OperationalError, DBAPIError, StoreDatabaseError):
                time.sleep(0.2)
                continue
            if statuses and all(settled(s) for s in statuses):
                seconds = round(time.monotonic() - started, 4)
                for status in statuses:
                    self.history.add("result", request_id=request_id, call_id=status.call_id,
                                     seconds=seconds, **_status_fields(status))
                return
            time.sleep(0.1)
        self.history.add("result_timeout", request_id=request_id,
                         abandoned=self._abandon.is_set())
