"""`toolfence demo`: a real fleet, a realistic workload, two injected faults, and proof.

What it does, in order:

1. Picks a fresh place to run, so reruns never collide: a directory
   `$TOOLFENCE_HOME/demo-<timestamp>-<pid>` for logs (and, on the embedded
   default, the SQLite file and the filesystem broker). With a PostgreSQL
   `TOOLFENCE_DATABASE_URL` it creates a throwaway database next to the one
   named (`<name>_demo_<timestamp>_<pid>`) and drops it at the end: the demo never
   touches an existing database's tables. With a Redis or RabbitMQ
   `TOOLFENCE_BROKER_URL` it uses a queue of its own and deletes it at the end.
2. Migrates, creates the reference ledger and accounts for two tenants, starts
   a relay, the workers and the reconciler (`reconcile --every 1`) as real
   subprocesses (`executor.fleet`).
3. Enqueues the workload in three waves (the second arriving as the fleet keeps
   up), one producer transaction per request:
   parallel reads, ordered writes on every effect contract, two transfers that
   need approval (one approved, one denied, through `executor.store`), and the
   mistakes a model makes that the admission gates refuse.
4. SIGKILLs one worker while it is inside a downstream call (an `unsafe` write
   if it can catch one), starts a replacement, then SIGSTOPs another while it is
   inside a fenced write, keeps it stopped until a new generation has taken the
   operation over and finished it, and SIGCONTs it: the ledger's fence refuses
   the stale write.
5. Once quiet, stops the fleet and checks invariants I1–I7 of DESIGN.md from
   the database and the ledger's own records. Exit status 1 if any fails.

Every process it started is stopped on the way out, also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import signal
import time
import traceback
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from executor import store
from executor.db import (
    approvals,
    audit_events,
    calls,
    make_engine,
    normalize_url,
    operations,
    read_only,
    receipts,
)
from executor.fleet import Fleet, Member, children_of
from executor.migrate import migrate
from executor.settings import default_home
from executor.states import SETTLED, State, is_legal
from executor.types import FailedRetryable, FailedTerminal, ProposedCall, ServerContext, Succeeded

EXIT_OK = 0
EXIT_INVARIANT_FAILED = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_USAGE = 2

# Tuned on a 2-core machine running SQLite and the filesystem transport: a
# downstream call takes ~60 ms (so a fault can be caught inside one), the relay
# polls every 50 ms (each write of a request waits for the previous one to be
# published), and a `queued` operation is only republished after 15 s, so a
# backlog in the broker is not mistaken for a lost message.
LEDGER_LATENCY_MS = 60
RELAY_POLL_SECONDS = 0.05
RECONCILE_EVERY_SECONDS = 1.0
REQUEUE_QUEUED_AFTER_SECONDS = 15.0
POLL_SECONDS = 0.25
SETTLE_TIMEOUT_SECONDS = 90.0
WAVES = (0.4, 0.3, 0.3)
STEADY_QUEUED = 25  # wave 2 arrives as the fleet keeps up: the pause's takeover is not stuck in a queue

APPROVER = "ops-lead@acme"
DENIER = "ops-lead@globex"


class DemoError(Exception):
    """Something the user can fix; printed as one line."""


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so the same cleanup runs as for Ctrl-C."""


# ---------------------------------------------------------------------- where it runs


@dataclass
class Place:
    """Where this run lives: a fresh directory, database and queue."""

    run_dir: Path
    database_url: str
    broker_url: str
    queue: str
    created_database: str | None = None  # PostgreSQL: dropped at the end
    admin_url: str | None = None

    @property
    def on_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def on_filesystem_broker(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    def fleet_env(self, lease_seconds: float) -> dict[str, str]:
        return {
            "TOOLFENCE_HOME": str(self.run_dir),
            "TOOLFENCE_DATABASE_URL": self.database_url,
            "TOOLFENCE_BROKER_URL": self.broker_url,
            "TOOLFENCE_QUEUE": self.queue,
            "TOOLFENCE_TOOLS": "ledger.tools:registry",
            "TOOLFENCE_FAULT_POINTS": "",
            "TOOLFENCE_LEASE_SECONDS": f"{lease_seconds:g}",
            "TOOLFENCE_RELAY_POLL_SECONDS": f"{RELAY_POLL_SECONDS:g}",
            "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": f"{REQUEUE_QUEUED_AFTER_SECONDS:g}",
            "TOOLFENCE_LEDGER_LATENCY_MS": str(LEDGER_LATENCY_MS),
            # The workers' own counters, kept apart from any other deployment's.
            "PROMETHEUS_MULTIPROC_DIR": str(self.run_dir / "metrics"),
        }

    def describe(self) -> str:
        database = (
            f"SQLite {self.database_url[len('sqlite:///'):]}"
            if self.on_sqlite
            else f"PostgreSQL database {self.created_database} (created for this run, dropped after)"
        )
        broker = (
            "kombu filesystem transport"
            if self.on_filesystem_broker
            else f"{self.broker_url.split('://', 1)[0]} queue {self.queue}"
        )
        return f"{database} · {broker}"


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def prepare_place(environ: Mapping[str, str]) -> Place:
    """A fresh directory, and a fresh database and queue when servers are configured."""
    stamp = _stamp()
    run_dir = default_home() / f"demo-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "metrics").mkdir()
    configured_db = environ.get("TOOLFENCE_DATABASE_URL", "")
    configured_broker = environ.get("TOOLFENCE_BROKER_URL", "")
    broker_url = configured_broker or f"filesystem://{run_dir / 'broker'}"
    if configured_broker.startswith("filesystem://"):
        broker_url = f"filesystem://{run_dir / 'broker'}"  # never reuse an old folder's messages
    queue = f"toolfence-demo-{stamp}"
    if not configured_db or configured_db.startswith("sqlite"):
        # An explicitly configured SQLite file is not reused either: a fresh file per run.
        return Place(run_dir, f"sqlite:///{run_dir / 'toolfence.db'}", broker_url, queue)
    admin_url = normalize_url(configured_db)
    base = make_url(admin_url)
    name = re.sub(r"[^a-z0-9_]", "_", f"{base.database or 'toolfence'}_demo_{stamp}".lower())[:63]
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:
        reason = str(exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc).strip().splitlines()[0]
        if isinstance(exc, OperationalError):
            raise DemoError(f"cannot reach the database: {reason}") from None
        raise DemoError(
            f"cannot create the demo's own database {name} ({reason}): the demo never uses an "
            "existing database's tables, so its role needs CREATEDB"
        ) from None
    finally:
        admin.dispose()
    database_url = base.set(database=name).render_as_string(hide_password=False)
    return Place(run_dir, database_url, broker_url, queue, created_database=name, admin_url=admin_url)


def teardown_place(place: Place) -> list[str]:
    """Drop what only this run used. Returns problems, for one line each."""
    problems: list[str] = []
    if place.created_database and place.admin_url:
        admin = create_engine(place.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{place.created_database}" WITH (FORCE)'))
        except Exception as exc:
            problems.append(f"could not drop database {place.created_database}: {type(exc).__name__}")
        finally:
            admin.dispose()
    if not place.on_filesystem_broker:
        try:
            _forget_queue(place)
        except Exception as exc:
            problems.append(f"could not delete queue {place.queue}: {type(exc).__name__}")
    return problems


def _forget_queue(place: Place) -> None:
    """Delete the run's queue and its bindings from the broker (names are unique to the run)."""
    if place.broker_url.startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(place.broker_url, socket_timeout=5)
        try:
            # The queue list (and its priority lists) and kombu's binding sets for it.
            for key in client.scan_iter(match=f"*{place.queue}*"):
                client.delete(key)
            # Remote-control bindings of this run's workers (node names carry our pid).
            node = f"-{os.getpid()}@"
            for key in client.scan_iter(match="_kombu.binding*pidbox*"):
                for member in client.smembers(key):
                    if node.encode() in member:
                        client.srem(key, member)
        finally:
            client.close()
        return
    from kombu.connection import Connection

    with Connection(place.broker_url, connect_timeout=5) as connection:  # type: ignore[no-untyped-call]
        channel = connection.default_channel
        channel.queue_delete(place.queue)
        channel.exchange_delete(place.queue)


# ---------------------------------------------------------------------- the workload


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
    return [("approval", "acme", approved), ("approval", "globex", denied), ("mistakes", "acme", mistakes)]


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


@dataclass(frozen=True)
class Snapshot:
    states: Mapping[str, int]
    rejected_calls: int

    @property
    def settled_calls(self) -> int:
        return self.rejected_calls + sum(self.states.get(s.value, 0) for s in SETTLED)

    @property
    def busy(self) -> int:
        return sum(
            self.states.get(s.value, 0)
            for s in (State.QUEUED, State.STARTED, State.RETRY_WAIT, State.PENDING_APPROVAL)
        )

    def summary(self) -> str:
        parts = [
            f"{label} {self.states.get(state.value, 0)}"
            for label, state in (
                ("queued", State.QUEUED), ("running", State.STARTED), ("retrying", State.RETRY_WAIT),
                ("awaiting approval", State.PENDING_APPROVAL),
            )
            if self.states.get(state.value, 0)
        ]
        return " · ".join(parts) or "idle"


def snapshot(reader: Engine) -> Snapshot:
    with reader.connect() as conn:
        states: dict[str, int] = {
            str(state): int(count)
            for state, count in conn.execute(
                select(operations.c.state, func.count()).group_by(operations.c.state)
            ).all()
        }
        rejected = conn.execute(
            select(func.count()).select_from(calls).where(calls.c.result.is_not(None))
        ).scalar_one()
    return Snapshot(states, int(rejected))


@dataclass(frozen=True)
class Owned:
    """An operation a worker's pool child holds right now."""

    operation_id: str
    tool_name: str
    generation: int


def owned_by(reader: Engine, pid: int) -> Owned | None:
    # Owner tokens start with the pid of the process that reserved (executor.runner).
    with reader.connect() as conn:
        row = conn.execute(
            select(operations.c.operation_id, operations.c.tool_name, operations.c.generation)
            .where(operations.c.state == State.STARTED.value, operations.c.owner_token.like(f"{pid}-%"))
            .limit(1)
        ).first()
    return None if row is None else Owned(row.operation_id, row.tool_name, int(row.generation))


def ledger_effect_exists(reader: Engine, operation_id: str) -> bool:
    from ledger.service import effects

    with reader.connect() as conn:
        return conn.execute(
            select(effects.c.receipt).where(effects.c.operation_id == operation_id).limit(1)
        ).first() is not None


_SLEEP_SYSCALLS = {"x86_64": {"35", "230"}, "aarch64": {"101", "115"}}.get(platform.machine(), set())


def sleeping(pid: int) -> bool:
    """Is the process's main thread in nanosleep? For a pool child running a write that is
    the downstream call (the ledger's latency) or a wait for SQLite's write lock, never a
    moment when it holds a transaction open."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split(" ", 1)[0] in _SLEEP_SYSCALLS
    except OSError:
        return False


def pool_child(member: Member) -> int | None:
    children = children_of(member.pid)
    return children[0] if children else None


def worker_ready(member: Member) -> bool:
    try:
        return "toolfence worker ready" in member.log_path.read_text(errors="replace")
    except OSError:
        return False


# ---------------------------------------------------------------------- the run


@dataclass
class Approvals:
    """The demo's approver: denies the one request it is meant to deny, approves the rest."""

    deny_request: str | None
    decided: set[str] = field(default_factory=set)
    seen_at: dict[str, float] = field(default_factory=dict)


@dataclass
class Paused:
    """What the paused worker held, and what became of it."""

    owned: Owned | None = None
    seconds: float = 0.0
    fence_reported: bool = False


class DemoRun:
    def __init__(
        self, console: Console, place: Place, requests: Sequence[DemoRequest], workers: int,
        lease_seconds: float,
    ) -> None:
        self.console = console
        self.place = place
        self.total_calls = sum(len(r.calls) for r in requests)
        self.lease_seconds = lease_seconds
        self.engine = make_engine(place.database_url)
        self.reader = read_only(self.engine)
        self.fleet = Fleet(
            env=place.fleet_env(lease_seconds), log_dir=place.run_dir / "logs", workers=workers,
            concurrency=1, reconcile_every=RECONCILE_EVERY_SECONDS,
        )
        denied = next((r for r in requests if r.kind == "approval" and r.tenant == "globex"), None)
        self.approvals = Approvals(denied.request_id if denied else None)
        self.paused = Paused()
        self.accounted_for: set[int] = set()  # processes whose exit is explained (we killed them)
        self.unplanned_exits = 0
        self.feeding: deque[DemoRequest] = deque()  # requests that arrive as the fleet keeps up
        self.progress: Progress | None = None
        self.task_id: Any = None
        self._last_tick = 0.0
        self._last_plain = 0.0
        self.started_at = time.monotonic()

    # -------------------------------------------------------------- output

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.console.print(message)
        else:
            self.console.print(message)

    def fault(self, message: str) -> None:
        self.say(f"[bold red]⚡[/] [dim]{time.monotonic() - self.started_at:5.1f} s[/] {message}")

    def tick(self, force: bool = False) -> Snapshot | None:
        """Refresh progress, decide approvals, replace crashed processes: every POLL_SECONDS."""
        now = time.monotonic()
        if not force and now - self._last_tick < POLL_SECONDS:
            return None
        self._last_tick = now
        self._replace_crashed()
        self._decide_approvals()
        self._report_fence()
        snap = snapshot(self.reader)
        if self.feeding:
            self._feed(snap)
        if self.progress is not None:
            self.progress.update(self.task_id, completed=snap.settled_calls, detail=snap.summary())
            if not self.console.is_terminal and now - self._last_plain >= 5.0:
                self._last_plain = now
                self.console.print(
                    f"  {snap.settled_calls}/{self.total_calls} calls settled · {snap.summary()}"
                )
        return snap

    def _replace_crashed(self) -> None:
        """A process that exits on its own is reported and replaced, never hidden.

        (The filesystem transport can hand a consumer a message file the relay has
        created but not yet written, and Celery treats that as unrecoverable:
        celery/kombu#1551. The reconciler republishes the message it lost.)"""
        for member in list(self.fleet.members):
            if member.alive() or member.pid in self.accounted_for:
                continue
            self.accounted_for.add(member.pid)
            self.unplanned_exits += 1
            if member.role == "worker":
                replacement = self.fleet.start_worker(self._next_worker_index())
            elif member.role == "relay":
                replacement = self.fleet.start_relay(member.index)
            else:
                replacement = self.fleet.start_reconciler()
            self.say(
                f"[yellow]![/] {member.role} {member.index} (pid {member.pid}) exited on its own with "
                f"status {member.process.returncode} (see {member.log_path}); started pid "
                f"{replacement.pid} in its place"
            )

    def start_fleet(self) -> None:
        """Relay, workers and reconciler; the first worker alone until it is ready.

        Two workers starting at once on the filesystem transport can both create its
        exchange table file, and one then reads it empty and dies (the same kombu race
        as celery/kombu#1551). Once the first worker has written the tables, the
        others only read and extend them under a lock.
        """
        self.fleet.start_relay(0)
        self.fleet.start_worker(0)
        self.fleet.wait_ready(90.0)
        for index in range(1, self.fleet.workers):
            self.fleet.start_worker(index)
        self.fleet.start_reconciler()
        self.fleet.wait_ready(90.0)

    def _next_worker_index(self) -> int:
        # Distinct from every worker started so far: its log file and Celery node name.
        return sum(1 for m in self.fleet.members if m.role == "worker")

    # -------------------------------------------------------------- setup

    def setup(self) -> None:
        from ledger.service import Ledger

        migrate(self.place.database_url)
        ledger = Ledger(self.place.database_url, latency_seconds=0.0)
        ledger.create_schema()
        for tenant, accounts in TENANTS.items():
            for account_id, cents in accounts.items():
                ledger.open_account(account_id, tenant, cents)
        ledger.engine.dispose()

    def enqueue(self, wave: Sequence[DemoRequest]) -> None:
        for request in wave:
            self._enqueue_one(request)
            self.tick()

    def _enqueue_one(self, request: DemoRequest) -> None:
        from ledger.tools import registry
        from outbox.producer import enqueue

        # One transaction per request, as a producer writes its own business rows in it too.
        with self.engine.begin() as conn:
            enqueue(conn, request.calls, request.context, registry)

    def feed(self, wave: Sequence[DemoRequest]) -> None:
        """Let `wave` arrive as the fleet keeps up, from every tick: at most STEADY_QUEUED
        operations queued, so a message the reconciler republishes is not stuck behind
        a long queue while a worker is paused."""
        self.feeding.extend(wave)

    def _feed(self, snap: Snapshot) -> None:
        room = STEADY_QUEUED - snap.states.get(State.QUEUED.value, 0)
        while self.feeding and room > 0:
            request = self.feeding.popleft()
            self._enqueue_one(request)
            room -= len(request.calls)

    def finish_feeding(self) -> None:
        while self.feeding:
            self.tick(force=True)
            time.sleep(POLL_SECONDS)

    # -------------------------------------------------------------- approvals

    def _decide_approvals(self) -> None:
        with self.reader.connect() as conn:
            pending = conn.execute(
                select(approvals.c.approval_id, approvals.c.impact, operations.c.request_id,
                       operations.c.tool_name)
                .join(operations, operations.c.operation_id == approvals.c.operation_id)
                .where(approvals.c.state == "pending")
            ).all()
        now = time.monotonic()
        for row in pending:
            if row.approval_id in self.approvals.decided:
                continue
            if row.approval_id not in self.approvals.seen_at:
                self.approvals.seen_at[row.approval_id] = now
                impact = json.loads(row.impact)
                self.say(
                    f"[bold yellow]✋ approval requested[/] {row.approval_id} for {row.tool_name}: "
                    f"{impact.get('summary', impact)}"
                )
                continue
            if now - self.approvals.seen_at[row.approval_id] < 1.0:
                continue  # let a person (the newcomer watching) see it pending first
            with self.engine.begin() as conn:
                if row.request_id == self.approvals.deny_request:
                    won = store.deny(conn, row.approval_id, approver=DENIER, reason="over the weekly limit")
                    verdict = f"[red]denied[/] by {DENIER} (store.deny)"
                else:
                    won = store.approve(conn, row.approval_id, approver=APPROVER)
                    verdict = f"[green]approved[/] by {APPROVER} (store.approve)"
            self.approvals.decided.add(row.approval_id)
            if won:
                self.say(f"[bold yellow]✋[/] {row.approval_id} {verdict}")

    # -------------------------------------------------------------- faults

    def _catch(
        self, member: Member, prefer: Sequence[Sequence[str]], patience: float,
        remaining_work: Any,
    ) -> tuple[int | None, Owned | None]:
        """Wait until the member's pool child is inside a downstream call of a preferred tool.

        `prefer` lists tool sets from most to least wanted; each later set is accepted
        after another `patience` seconds. Gives up (returns no operation) once the work
        that could be caught has all settled.
        """
        started = time.monotonic()
        while True:
            child = pool_child(member)
            elapsed = time.monotonic() - started
            level = min(int(elapsed // patience), len(prefer) - 1)
            wanted = {tool for group in prefer[: level + 1] for tool in group}
            if child is not None and sleeping(child):
                owned = owned_by(self.reader, child)
                if (
                    owned is not None and owned.tool_name in wanted
                    and not ledger_effect_exists(self.reader, owned.operation_id)
                ):
                    return child, owned
            snap = self.tick()
            if snap is not None and not remaining_work(snap):
                return child, None
            time.sleep(0.002)

    def kill_one(self) -> Member | None:
        workers = self.fleet.by_role("worker")
        if not workers:
            return None
        victim = workers[0]
        child, owned = self._catch(
            victim,
            prefer=[("ledger.send_notice",), ("ledger.create_invoice", "ledger.credit", "ledger.transfer")],
            patience=6.0,
            remaining_work=lambda snap: snap.busy > 0 or bool(self.feeding),
        )
        self.accounted_for.add(victim.pid)
        os.killpg(victim.pid, signal.SIGKILL)
        holding = (
            f"while it was inside {owned.tool_name} {owned.operation_id} (generation {owned.generation})"
            if owned else "while it was idle"
        )
        self.fault(f"SIGKILL worker {victim.index} (pid {victim.pid}, pool child {child}) {holding}")
        if owned and owned.tool_name == "ledger.send_notice":
            self.say(
                "   an unsafe write with an unknown outcome: the reconciler will hand it to a person "
                "(reconciliation_pending), never retry it"
            )
        replacement = self.fleet.start_worker(self._next_worker_index())
        self.say(f"   started replacement worker {replacement.index} (pid {replacement.pid})")
        return replacement

    def pause_one(self, replacement: Member | None) -> None:
        """SIGSTOP a worker inside a fenced write; SIGCONT it once a new generation finished it."""
        while replacement is not None and replacement.alive() and not worker_ready(replacement):
            self.tick()
            time.sleep(0.05)
        if replacement is not None:
            self.say(f"   replacement worker {replacement.index} is ready")
        candidates = [m for m in self.fleet.by_role("worker") if m is not replacement] or [
            m for m in self.fleet.by_role("worker")
        ]
        if not candidates:
            return
        victim = candidates[0]
        takeover_tools = ("ledger.transfer",), ("ledger.credit",), ("ledger.get_balance",)
        child, owned = self._catch(
            victim, prefer=takeover_tools, patience=4.0,
            remaining_work=lambda snap: snap.busy > 0 or bool(self.feeding),
        )
        if owned is None and child is not None and not self._idle(child):
            self.say("   no safe moment to pause a worker (it never sat in a downstream call); skipped")
            return
        os.killpg(victim.pid, signal.SIGSTOP)
        paused_at = time.monotonic()
        self.paused.owned = owned
        holding = (
            f"inside {owned.tool_name} {owned.operation_id} (generation {owned.generation})"
            if owned else "while idle"
        )
        self.fault(
            f"SIGSTOP worker {victim.index} (pid {victim.pid}) {holding}; "
            f"keeping it stopped past its {self.lease_seconds:g} s lease"
        )
        self._resume_after_takeover(victim, owned, paused_at)

    def _idle(self, child: int) -> bool:
        """A pool child waiting for work holds no transaction: safe to stop."""
        return owned_by(self.reader, child) is None and not sleeping(child)

    def _resume_after_takeover(self, victim: Member, owned: Owned | None, paused_at: float) -> None:
        minimum = self.lease_seconds + 0.5
        maximum = max(3 * self.lease_seconds, self.lease_seconds + 12.0)
        taken_over: Any = None
        while True:
            elapsed = time.monotonic() - paused_at
            if owned is not None and taken_over is None:
                with self.reader.connect() as conn:
                    row = store.get_operation(conn, owned.operation_id)
                if row is not None and row.generation > owned.generation and row.state in (
                    State.SUCCEEDED.value, State.FAILED_TERMINAL.value
                ):
                    taken_over = row
            done = owned is None or taken_over is not None
            if (elapsed >= minimum and done) or elapsed >= maximum:
                break
            self.tick()
            time.sleep(0.02)
        os.killpg(victim.pid, signal.SIGCONT)
        self.paused.seconds = time.monotonic() - paused_at
        detail = ""
        if owned is not None and taken_over is not None:
            detail = (
                f": meanwhile generation {taken_over.generation} took {owned.operation_id} over and "
                f"it {taken_over.state}; the paused worker still holds generation {owned.generation}"
            )
        elif owned is not None:
            detail = f": {owned.operation_id} was not taken over in time"
        self.fault(f"SIGCONT worker {victim.index} after {self.paused.seconds:.1f} s{detail}")

    def _report_fence(self) -> None:
        paused = self.paused.owned
        if paused is None or self.paused.fence_reported or not self.paused.seconds:
            return
        from ledger.service import fenced_writes

        with self.reader.connect() as conn:
            row = conn.execute(
                select(fenced_writes.c.token, fenced_writes.c.highest_token)
                .where(fenced_writes.c.operation_id == paused.operation_id)
                .limit(1)
            ).first()
        if row is not None:
            self.paused.fence_reported = True
            self.say(
                f"   the ledger refused the resumed worker's write: fencing token {row.token} "
                f"< {row.highest_token} already seen for {paused.operation_id}"
            )

    # -------------------------------------------------------------- waiting

    def wait_until_quiet(self, timeout: float, stalled_after: float) -> bool:
        """Until every call is settled and nothing runs; False after `timeout`, or once
        nothing has changed for `stalled_after` seconds (longer than the reconciler
        takes to republish a lost message)."""
        deadline = time.monotonic() + timeout
        last_change, last_seen = time.monotonic(), None
        quiet_polls = 0
        while time.monotonic() < deadline and time.monotonic() - last_change < stalled_after:
            snap = self.tick(force=True)
            assert snap is not None
            if snap != last_seen:
                last_change, last_seen = time.monotonic(), snap
            if snap.settled_calls >= self.total_calls and snap.busy == 0:
                quiet_polls += 1
                if quiet_polls >= 2:  # twice in a row: nothing moved in between
                    return True
            else:
                quiet_polls = 0
            time.sleep(POLL_SECONDS)
        return False


# ---------------------------------------------------------------------- the evidence


@dataclass(frozen=True)
class Check:
    code: str
    title: str
    passed: bool
    evidence: str


@dataclass
class Figures:
    states: Counter[str] = field(default_factory=Counter)
    failed_codes: Counter[str] = field(default_factory=Counter)
    pending_tools: Counter[str] = field(default_factory=Counter)
    gates: Counter[str] = field(default_factory=Counter)
    gate_codes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    writes: int = 0
    ledger_effects: Counter[int] = field(default_factory=Counter)  # effects per write → ops
    receipt_effects: Counter[int] = field(default_factory=Counter)
    ledger_only: int = 0
    fenced_refusals: int = 0
    takeovers_by_worker: int = 0
    requeued_by_reconciler: int = 0
    lookups_resolved: int = 0
    stale_counters: Mapping[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def all_passed(self) -> bool:
        return all(c.passed for c in self.checks)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _examples(items: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def gather(engine: Engine, requests: Sequence[DemoRequest], metrics_dir: Path | None) -> Figures:
    """Every figure and invariant, from the database and the ledger's own tables."""
    from ledger.service import effects, fenced_writes
    from outbox.producer import default_operation_id, final, results, settled

    figures = Figures()
    reader = read_only(engine)
    with reader.connect() as conn:
        ops = {r.operation_id: r for r in conn.execute(select(operations))}
        call_rows = list(conn.execute(select(calls)))
        events = list(conn.execute(select(audit_events).order_by(audit_events.c.event_id)))
        receipt_rows = list(conn.execute(select(receipts)))
        effect_rows = list(conn.execute(select(effects)))
        fenced_rows = list(conn.execute(select(fenced_writes)))

    # ---- figures
    for op in ops.values():
        figures.states[op.state] += 1
        if op.state == State.FAILED_TERMINAL.value:
            figures.failed_codes[op.error_code or "?"] += 1
        if op.state == State.RECONCILIATION_PENDING.value:
            figures.pending_tools[op.tool_name] += 1
    for row in call_rows:
        if row.result is not None:
            gate = row.gate or "?"
            figures.gates[gate] += 1
            figures.gate_codes[gate][json.loads(row.result).get("error", {}).get("code", "?")] += 1
    ledger_receipts: dict[str, set[str]] = defaultdict(set)
    for effect in effect_rows:
        ledger_receipts[effect.operation_id].add(effect.receipt)
    accepted: dict[str, set[str]] = defaultdict(set)
    for receipt in receipt_rows:
        if receipt.accepted:
            accepted[receipt.operation_id].add(receipt.receipt)
    write_ops = [op for op in ops.values() if op.mode == "write"]
    figures.writes = len(write_ops)
    for op in write_ops:
        figures.ledger_effects[len(ledger_receipts.get(op.operation_id, ()))] += 1
        figures.receipt_effects[len(accepted.get(op.operation_id, ()))] += 1
        if ledger_receipts.get(op.operation_id) and not accepted.get(op.operation_id):
            figures.ledger_only += 1
    figures.fenced_refusals = len(fenced_rows)
    decisions = Counter(e.decision_code for e in events)
    figures.takeovers_by_worker = decisions["lease_takeover"]
    figures.requeued_by_reconciler = decisions["requeued_stale"]
    figures.lookups_resolved = decisions["lookup_done"]
    figures.stale_counters = _stale_counters(metrics_dir)

    # ---- I1: at most one distinct receipt per operation, in either party's records
    over: list[str] = []
    for operation_id in set(ledger_receipts) | set(accepted):
        if len(ledger_receipts.get(operation_id, set()) | accepted.get(operation_id, set())) > 1:
            over.append(operation_id)
    most = max(
        [len(ledger_receipts.get(o, set()) | accepted.get(o, set())) for o in ops] or [0]
    )
    figures.checks.append(Check(
        "I1", "≤ 1 side effect per operation", not over,
        f"max {most} distinct receipt per operation (ledger records ∪ toolfence receipts)"
        if not over else f"{len(over)} operations with more: {_examples(over)}",
    ))

    # ---- I2: quiet → terminal or reconciliation_pending
    unsettled = [o for o, op in ops.items() if State(op.state) not in SETTLED]
    figures.checks.append(Check(
        "I2", "everything settled once quiet", not unsettled,
        f"{len(ops)} of {len(ops)} operations terminal or reconciliation_pending" if not unsettled
        else f"{len(unsettled)} still moving: {_examples(unsettled)}",
    ))

    # ---- I3: no write from a stale generation accepted
    grants: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for event in events:
        if event.decision_code in ("reserved", "lease_takeover"):
            grants[event.operation_id].append((int(event.generation), float(event.at)))
    stale_effects: list[str] = []
    for effect in effect_rows:
        superseded = [
            at for generation, at in grants.get(effect.operation_id, []) if generation > effect.generation
        ]
        if superseded and min(superseded) < effect.at:
            stale_effects.append(effect.operation_id)
    refused = {(row.operation_id, int(row.token)) for row in fenced_rows}
    accepted_after_refusal = [
        e.operation_id for e in effect_rows if (e.operation_id, int(e.generation)) in refused
    ]
    finished = (State.SUCCEEDED.value, State.FAILED_TERMINAL.value)
    completions = [e for e in events if e.from_state == State.STARTED.value and e.to_state in finished]
    stale_completions = [
        e.operation_id for e in completions
        if int(e.generation) != max((g for g, _ in grants.get(e.operation_id, [])), default=0)
    ]
    i3_bad = stale_effects + accepted_after_refusal + stale_completions
    figures.checks.append(Check(
        "I3", "no stale write accepted", not i3_bad,
        f"{len(effect_rows)} ledger effects, each by the generation that owned the operation then; "
        f"{len(completions)} completions by the current generation; "
        f"{len(fenced_rows)} stale token{'s' if len(fenced_rows) != 1 else ''} refused, none accepted"
        if not i3_bad else
        f"stale effects {len(stale_effects)}, accepted after refusal {len(accepted_after_refusal)}, "
        f"stale completions {len(stale_completions)}: {_examples(i3_bad)}",
    ))

    # ---- I4: no admitted proposal lost; no operation that was not admitted
    proposed = {(r.request_id, c.call_id) for r in requests for c in r.calls}
    recorded = {(row.request_id, row.call_id) for row in call_rows}
    admitted = [row for row in call_rows if row.operation_id is not None]
    orphan_calls = [
        row.call_id for row in admitted
        if row.operation_id not in ops
        or (ops[row.operation_id].request_id, ops[row.operation_id].call_id) != (row.request_id, row.call_id)
    ]
    referenced = {row.operation_id for row in admitted}
    unadmitted_ops = [o for o in ops if o not in referenced]
    i4_ok = proposed == recorded and not orphan_calls and not unadmitted_ops
    figures.checks.append(Check(
        "I4", "no proposal lost or invented", i4_ok,
        f"{len(proposed)} proposals recorded; {len(admitted)} admitted = {len(ops)} operations"
        if i4_ok else
        f"missing proposals {len(proposed - recorded)}, unknown {len(recorded - proposed)}, "
        f"admitted without operation {len(orphan_calls)}, operations without admission {len(unadmitted_ops)}",
    ))

    # ---- I5: legal transitions, consistent trail, monotonic generation
    by_op: dict[str, list[Any]] = defaultdict(list)
    for event in events:
        by_op[event.operation_id].append(event)
    illegal: list[str] = []
    for operation_id, trail in by_op.items():
        previous_state: str | None = None
        previous_generation = 0
        for event in trail:
            if (
                not is_legal(event.from_state, event.to_state)
                or event.from_state != previous_state
                or event.generation < previous_generation
            ):
                illegal.append(operation_id)
                break
            previous_state, previous_generation = event.to_state, int(event.generation)
        else:
            current = ops.get(operation_id)
            if (
                current is None
                or current.state != previous_state
                or current.generation != previous_generation
            ):
                illegal.append(operation_id)
    untraced = [o for o in ops if o not in by_op]
    figures.checks.append(Check(
        "I5", "legal transitions, generation grows", not illegal and not untraced,
        f"{len(events)} audit events over {len(by_op)} operations, each trail legal and "
        "ending in the operation's state and generation"
        if not illegal and not untraced
        else f"{len(illegal)} bad trails, {len(untraced)} untraced: {_examples(illegal + untraced)}",
    ))

    # ---- I6: one terminal result per call id, with its own tool name
    wrong: list[str] = []
    for request in requests:
        statuses = results(engine, request.request_id)
        if [s.call_id for s in statuses] != [c.call_id for c in request.calls]:
            wrong.append(request.request_id)
            continue
        for proposal, status in zip(request.calls, statuses, strict=True):
            outcome = final(status)
            if (
                status.tool_name != proposal.tool_name
                or not settled(status)
                or getattr(status, "state", None) == State.PENDING_APPROVAL.value
                or not isinstance(outcome, Succeeded | FailedTerminal | FailedRetryable)
                or outcome.call_id != proposal.call_id
            ):
                wrong.append(f"{request.request_id}/{proposal.call_id}")
    figures.checks.append(Check(
        "I6", "one result per call id", not wrong,
        f"{len(proposed)} calls in {len(requests)} requests: one terminal result each, in proposal "
        "order, with its own tool name"
        if not wrong else f"{len(wrong)} wrong: {_examples(wrong)}",
    ))

    # ---- I7: a rejected call invoked its handler zero times
    rejected_ids = {
        default_operation_id(row.request_id, row.call_id) for row in call_rows if row.operation_id is None
    }
    traced = (
        rejected_ids & set(ops)
        | rejected_ids & set(by_op)
        | rejected_ids & {r.operation_id for r in receipt_rows}
        | rejected_ids & {e.operation_id for e in effect_rows}
    )
    figures.checks.append(Check(
        "I7", "rejected calls never ran", not traced,
        f"{len(rejected_ids)} rejected calls: no operation, audit event, receipt or ledger effect"
        if not traced else f"{len(traced)} rejected calls left traces: {_examples(sorted(traced))}",
    ))
    return figures


def _stale_counters(metrics_dir: Path | None) -> dict[str, float]:
    """toolfence_stale_writes_fenced_total by stage, summed over the workers' metric files."""
    if metrics_dir is None or not metrics_dir.is_dir():
        return {}
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(metrics_dir))  # type: ignore[no-untyped-call]
        totals: dict[str, float] = {}
        for family in registry.collect():
            if family.name != "toolfence_stale_writes_fenced":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    stage = sample.labels.get("stage", "?")
                    totals[stage] = totals.get(stage, 0.0) + sample.value
        return totals
    except Exception:
        return {}


# ---------------------------------------------------------------------- the tables


def model_view(engine: Engine, request: DemoRequest) -> Table:
    """One request's results as a model receives them: one per call id, in proposal order."""
    from outbox.producer import final, results

    table = Table(title=f"What the model gets back for {request.request_id}", title_justify="left")
    for header in ("call id", "tool", "result", "detail"):
        table.add_column(header, overflow="fold")
    for proposal, status in zip(request.calls, results(engine, request.request_id), strict=False):
        outcome = final(status)
        if isinstance(outcome, Succeeded):
            detail = json.dumps(outcome.output, separators=(", ", ": "))
            verdict = Text("succeeded", style="green")
        else:
            paths = ", ".join(f"{d.path or '(root)'}: {d.code}" for d in outcome.error.details)
            detail = f"{outcome.error.code.value}" + (f" ({paths})" if paths else "")
            verdict = Text(outcome.status, style="red")
        table.add_row(outcome.call_id, proposal.tool_name, verdict, detail)
    return table



def _counts(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counter.items(), key=lambda kv: -kv[1]))


def render(
    figures: Figures, *, calls_total: int, requests: int, seconds: float, place: Place,
    unplanned_exits: int = 0,
) -> Table:
    table = Table(
        title=f"toolfence demo: {_n(calls_total, 'call')} in {_n(requests, 'request')}, {seconds:.0f} s",
        caption=place.describe(),
        show_header=False,
        expand=False,
    )
    table.add_column("", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("", overflow="fold")

    table.add_row(Text("Operations by final state", style="bold"), "", "")
    for state in (State.SUCCEEDED, State.FAILED_TERMINAL, State.RECONCILIATION_PENDING):
        count = figures.states.get(state.value, 0)
        note = ""
        if state is State.FAILED_TERMINAL:
            note = _counts(figures.failed_codes)
        if state is State.RECONCILIATION_PENDING:
            note = (
                f"{_counts(figures.pending_tools)}: an unsafe write whose worker died; "
                "nothing retries it, a person decides (toolfence pending / resolve)"
                if count else "none"
            )
        table.add_row(f"  {state.value}", str(count), note)
    others = {k: v for k, v in figures.states.items() if State(k) not in SETTLED}
    for state_name, count in sorted(others.items()):
        table.add_row(f"  {state_name}", str(count), Text("not settled", style="red"))

    table.add_section()
    rejected = sum(figures.gates.values())
    table.add_row(
        Text("Rejected before running, by gate", style="bold"), str(rejected), "toolfence_calls.gate"
    )
    for gate in ("allowlist", "parse", "schema", "authorization", "business_rules", "approval",
                 "ordering", "registration"):
        if figures.gates.get(gate):
            table.add_row(f"  {gate}", str(figures.gates[gate]), _counts(figures.gate_codes[gate]))

    table.add_section()
    table.add_row(
        Text("Side effects per write operation", style="bold"), str(figures.writes),
        "operations: by the ledger's records / by toolfence's receipts",
    )
    for effects_count in sorted(set(figures.ledger_effects) | set(figures.receipt_effects)):
        table.add_row(
            f"  with {effects_count} effect{'s' if effects_count != 1 else ''}",
            f"{figures.ledger_effects.get(effects_count, 0)} / "
            f"{figures.receipt_effects.get(effects_count, 0)}",
            "" if effects_count <= 1 else Text("more than one: I1 broken", style="red"),
        )
    if figures.ledger_only:
        table.add_row(
            "  effect the worker never reported", str(figures.ledger_only),
            "its worker died after the ledger applied it; the ledger's record is what counts",
        )

    table.add_section()
    table.add_row(Text("Faults and fencing", style="bold"), "", "")
    table.add_row(
        "  lease takeovers", str(figures.takeovers_by_worker + figures.requeued_by_reconciler),
        f"new generation after an expired lease: {figures.requeued_by_reconciler} requeued by the "
        f"reconciler, {figures.takeovers_by_worker} taken over by a worker",
    )
    if figures.lookups_resolved:
        table.add_row("  resolved by lookup", str(figures.lookups_resolved),
                      "the reconciler asked the ledger whether the invoice exists")
    counters = (
        "; workers' counters toolfence_stale_writes_fenced_total: "
        + ", ".join(f"{stage} {value:g}" for stage, value in sorted(figures.stale_counters.items()))
        if figures.stale_counters else ""
    )
    table.add_row(
        "  fenced stale writes", str(figures.fenced_refusals),
        f"writes the ledger refused for an old fencing token (ledger_fenced){counters}",
    )
    table.add_row("  reconciliation_pending", str(figures.states.get(State.RECONCILIATION_PENDING.value, 0)),
                  "waiting for a person: correct for an unsafe write of unknown outcome")
    if unplanned_exits:
        table.add_row("  unplanned process exits", str(unplanned_exits),
                      "not injected by the demo; each was replaced (see the line printed when it happened)")

    table.add_section()
    table.add_row(Text("Invariants (DESIGN.md)", style="bold"), "", "")
    for check in figures.checks:
        verdict = Text("PASS", style="bold green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(f"  {check.code} {check.title}", verdict, check.evidence)
    return table


# ---------------------------------------------------------------------- entry point


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C: raise in the main thread, run the cleanup."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise _Terminated()

    previous_term = signal.signal(signal.SIGTERM, on_term)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """Cleanup must finish: a second Ctrl-C must not leave processes behind."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """The producer side (this process) reads the same settings as the fleet."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _error_console() -> Console:
    return Console(stderr=True, soft_wrap=True)


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=160, no_color=True)


def run_demo(calls: int = 300, workers: int = 2, lease_seconds: float = 3.0) -> int:
    console = _console()
    if calls < 1 or workers < 1 or lease_seconds < 1.0:
        _error_console().print("toolfence demo: needs --calls ≥ 1, --workers ≥ 1 and --lease ≥ 1 second")
        return EXIT_USAGE
    requests = build_workload(calls)
    place: Place | None = None
    run: DemoRun | None = None
    outcome = EXIT_INVARIANT_FAILED
    with _signals_raise():
        try:
            place = prepare_place(os.environ)
            with _environment(place.fleet_env(lease_seconds)):
                run = DemoRun(console, place, requests, workers, lease_seconds)
                outcome = _run(run, requests)
        except KeyboardInterrupt:
            outcome = EXIT_INTERRUPTED
        except _Terminated:
            outcome = EXIT_TERMINATED
        except DemoError as exc:
            _error_console().print(f"toolfence demo: {exc}")
            outcome = EXIT_USAGE
        except Exception as exc:
            outcome = _report_crash(exc, place)
        finally:
            with _signals_ignored():
                _cleanup(console, run, place, outcome)
    return outcome


def _run(run: DemoRun, requests: Sequence[DemoRequest]) -> int:
    console, place = run.console, run.place
    console.print(
        f"[bold]toolfence demo[/]: {_n(run.total_calls, 'call')} in {_n(len(requests), 'request')} "
        f"from 2 tenants, {_n(run.fleet.workers, 'worker')}, lease {run.lease_seconds:g} s"
    )
    console.print(f"  {place.describe()}")
    console.print(f"  run directory {place.run_dir} (logs in logs/)")
    run.setup()
    console.print("  schema migrated, ledger opened with 7 accounts; starting relay, workers, reconciler…")
    run.start_fleet()
    waves = split_waves(requests)
    columns = (
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("calls settled"), TimeElapsedColumn(), TextColumn("{task.fields[detail]}"),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        run.progress = progress
        run.task_id = progress.add_task("demo", total=run.total_calls, detail="")
        run.started_at = time.monotonic()
        run.say(f"wave 1: {_n(sum(len(r.calls) for r in waves[0]), 'call')}")
        run.enqueue(waves[0])
        replacement = run.kill_one()
        if waves[1]:
            calls_in_wave = _n(sum(len(r.calls) for r in waves[1]), "call")
            run.say(f"wave 2: {calls_in_wave}, arriving as the fleet keeps up")
        run.feed(waves[1])
        run.pause_one(replacement)
        run.finish_feeding()
        if waves[2]:
            run.say(f"wave 3: {_n(sum(len(r.calls) for r in waves[2]), 'call')}")
        run.enqueue(waves[2])
        quiet = run.wait_until_quiet(
            SETTLE_TIMEOUT_SECONDS, stalled_after=REQUEUE_QUEUED_AFTER_SECONDS + 10.0
        )
        run.tick(force=True)
        if not quiet:
            run.say("[red]the fleet did not settle in time; the checks below say what is stuck[/]")
    seconds = time.monotonic() - run.started_at
    run.progress = None
    run.fleet.stop()
    figures = gather(run.engine, requests, place.run_dir / "metrics")
    console.print()
    mistakes = next((r for r in requests if r.kind == "mistakes"), None)
    if mistakes is not None:
        console.print(model_view(run.engine, mistakes))
        console.print()
    console.print(
        render(
            figures, calls_total=run.total_calls, requests=len(requests), seconds=seconds, place=place,
            unplanned_exits=run.unplanned_exits,
        )
    )
    if figures.all_passed:
        console.print("[bold green]All invariants hold.[/]")
    else:
        console.print(f"[bold red]Invariant violated[/]: see the FAIL rows; logs in {place.run_dir / 'logs'}")
    if place.on_sqlite:
        console.print(f"Look around: TOOLFENCE_HOME={place.run_dir} toolfence pending")
    return EXIT_OK if figures.all_passed else EXIT_INVARIANT_FAILED


def _report_crash(exc: Exception, place: Place | None) -> int:
    """One line for the person, the traceback in the run directory for whoever debugs it."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    where = ""
    if place is not None:
        report = place.run_dir / "demo-error.txt"
        report.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
        where = f"; traceback in {report}, process logs in {place.run_dir / 'logs'}"
    _error_console().print(f"toolfence demo failed: {type(exc).__name__}: {first_line}{where}")
    return EXIT_INVARIANT_FAILED


def _cleanup(console: Console, run: DemoRun | None, place: Place | None, outcome: int) -> None:
    if run is not None:
        run.progress = None
        run.fleet.stop(timeout=8.0)
        run.engine.dispose()
        if outcome in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            started = len(run.fleet.members)
            console.print(f"\ninterrupted: stopped the {started} processes this demo started")
    if place is not None:
        for problem in teardown_place(place):
            console.print(f"toolfence demo: {problem}")
