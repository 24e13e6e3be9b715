"""Helpers for the fleet tests: building calls, waiting, and reading what happened.

Everything a test asserts comes from outside the worker processes: the database
(operations, audit events, receipts, the ledger's own effect records, the
`fleet_invocations` table) and the workers' Prometheus multiprocess files.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fleet_tools import invocations, registry
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, Row, func, select

from executor import store
from executor.cli.fleet import Fleet, Member, children_of
from executor.core.types import CallStatus, ProposedCall, ServerContext
from executor.store.schema import audit_events, receipts
from executor.telemetry.exporter import MultiprocessTreeCollector
from outbox.producer import EnqueueHandle, enqueue

T = TypeVar("T")

on_both_brokers = pytest.mark.parametrize("broker_url", ["redis", "rabbitmq"], indirect=True)


def call(call_id: str, tool: str, **arguments: object) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool, arguments=json.dumps(arguments))


def context(request_id: str, *, principal: str = "alice", tenant: str = "acme") -> ServerContext:
    return ServerContext(
        principal=principal, tenant=tenant, roles=frozenset({"member"}), request_id=request_id
    )


def outcome(status: CallStatus) -> tuple[str, str | None]:
    """(status, error code or None): what a failed comparison should show."""
    error = getattr(status, "error", None)
    return status.status, None if error is None else error.code.value


def enqueue_committed(
    engine: Engine, calls: Sequence[ProposedCall], ctx: ServerContext
) -> EnqueueHandle:
    with engine.begin() as conn:
        return enqueue(conn, calls, ctx, registry)


def wait_until(
    probe: Callable[[], T],
    *,
    timeout: float,
    what: str,
    show: Callable[[], object] | None = None,
    interval: float = 0.05,
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` otherwise,
    with `show()` (what the test would like to see) or the probe's last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = show() if show is not None else value
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {seen!r}")
        time.sleep(interval)


# ------------------------------------------------------------------ database


def operation(engine: Engine, operation_id: str) -> store.OperationRow:
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None, f"no operation {operation_id}"
    return row


def states(engine: Engine, operation_ids: Iterable[str]) -> dict[str, str]:
    with engine.connect() as conn:
        return {op_id: row.state for op_id, row in store.operations_in(conn, operation_ids).items()}


def all_in(engine: Engine, operation_ids: Sequence[str], wanted: set[str]) -> bool:
    found = states(engine, operation_ids)
    return len(found) == len(operation_ids) and set(found.values()) <= wanted


def audit(engine: Engine, operation_id: str) -> list[Row[Any]]:
    with engine.connect() as conn:
        return store.audit_trail(conn, operation_id)


def audit_by_call(engine: Engine) -> dict[str, list[Row[Any]]]:
    """Audit events per call id, in order (for a test whose call ids are unique)."""
    with engine.connect() as conn:
        rows = conn.execute(select(audit_events).order_by(audit_events.c.event_id)).all()
    trail: dict[str, list[Row[Any]]] = {}
    for row in rows:
        trail.setdefault(row.call_id, []).append(row)
    return trail


def terminal_events(trail: Iterable[Row[Any]]) -> list[Row[Any]]:
    return [e for e in trail if e.to_state in ("succeeded", "failed_terminal")]


def accepted_receipts(engine: Engine) -> dict[str, int]:
    """Distinct accepted receipts per operation, as toolfence recorded them."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(receipts.c.operation_id, func.count(func.distinct(receipts.c.receipt)))
            .where(receipts.c.accepted.is_(True))
            .group_by(receipts.c.operation_id)
        ).all()
    return {op_id: int(count) for op_id, count in rows}


def handler_invocations(engine: Engine) -> dict[str, int]:
    """Handler invocations per operation, recorded by the handler wrapper itself."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(invocations.c.operation_id, func.count()).group_by(invocations.c.operation_id)
        ).all()
    return {op_id: int(count) for op_id, count in rows}


def table_count(engine: Engine, table: Any, *where: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one())


def owner_pid(engine: Engine, operation_id: str) -> int | None:
    """The pid in the owner token (`{pid}-{hex}`) of a started operation."""
    row = operation(engine, operation_id)
    if row.state != "started" or not row.owner_token:
        return None
    return int(row.owner_token.split("-", 1)[0])


def worker_of(fleet: Fleet, pid: int) -> Member:
    """The worker member whose main process is `pid` or has it as a pool child."""
    for member in fleet.by_role("worker"):
        if member.pid == pid or pid in children_of(member.pid):
            return member
    raise AssertionError(f"pid {pid} belongs to no worker of the fleet")



# ------------------------------------------------------------------ metrics


def metric(metrics_dir: str | Path, name: str, **labels: str) -> float:
    """Sum of a counter's samples over every process (dead ones included) matching `labels`."""
    collector = CollectorRegistry()
    collector.register(MultiprocessTreeCollector(str(metrics_dir)))
    total = 0.0
    for family in collector.collect():
        for sample in family.samples:
            if sample.name != name:
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def metric_of_process(metrics_dir: str | Path, pid: int, name: str, **labels: str) -> float:
    """The same sum, from one process's files only (copied aside: the collector reads a folder)."""
    with tempfile.TemporaryDirectory() as folder:
        for path in Path(metrics_dir).glob(f"*_{pid}.db"):
            shutil.copy(path, folder)
        return metric(folder, name, **labels)


def metric_by_label(metrics_dir: str | Path, name: str, label: str) -> dict[str, float]:
    collector = CollectorRegistry()
    collector.register(MultiprocessTreeCollector(str(metrics_dir)))
    found: dict[str, float] = {}
    for family in collector.collect():
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get(label, "")
                found[key] = found.get(key, 0.0) + sample.value
    return found


# ------------------------------------------------------------------ broker


def queue_length(broker_url: str, queue: str) -> int:
    """Messages waiting (not delivered to a consumer) in a broker queue."""
    from kombu import Connection
    from kombu.exceptions import ChannelError

    with Connection(broker_url, connect_timeout=5) as conn:
        try:
            _, count, _ = conn.default_channel.queue_declare(queue=queue, passive=True)
        except ChannelError:
            return 0  # Redis keeps no key for an empty queue: "not found" is empty
    return int(count)
