"""Helpers for the reconciler's fleet tests (tests/fleet/test_reconciler_*.py).

What a test asserts is read from outside the processes it starts: the operation
store, the ledger's own effect records, the metrics files that every process
writes to `PROMETHEUS_MULTIPROC_DIR`, the exporter's `/metrics` page and the
`toolfence` command's output.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, Row, func, select

from executor import store
from executor.cli.fleet import Fleet, children_of, process_alive
from executor.core.types import ProposedCall, ServerContext
from executor.store.schema import audit_events, operations, receipts
from executor.telemetry.exporter import MultiprocessTreeCollector
from ledger import service as ledger_service
from ledger.tools import registry
from outbox.producer import enqueue

T = TypeVar("T")

# The reference ledger's own tools, whatever registry the shared fixtures choose:
# the fault points and lookups below name them.
TOOLS_ENV = {"TOOLFENCE_TOOLS": "ledger.tools:registry"}
ACME = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="-")


@contextmanager
def logs_on_failure(*fleets: Fleet) -> Iterator[None]:
    """Print every fleet's logs when the block fails (pytest shows them with the failure)."""
    try:
        yield
    except BaseException:
        for index, fleet in enumerate(fleets):
            print(f"\n######## fleet {index} logs\n{fleet.logs()}")
        raise


def wait_until(probe: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


# ------------------------------------------------------------------ producing work


def enqueue_one(engine: Engine, tool: str, **arguments: object) -> str:
    """One call in its own request, committed; returns its operation id."""
    request_id = f"req-{uuid.uuid4().hex[:12]}"
    ctx = ServerContext(
        principal=ACME.principal, tenant=ACME.tenant, roles=ACME.roles, request_id=request_id
    )
    call = ProposedCall(call_id="c1", tool_name=tool, arguments=json.dumps(arguments))
    with engine.begin() as conn:
        handle = enqueue(conn, [call], ctx, registry)
    [admitted] = handle.calls
    assert admitted.operation_id is not None, admitted
    return admitted.operation_id


def stale_operations(
    engine: Engine, calls: Sequence[tuple[str, dict[str, Any]]], lease_seconds: float = 0.05
) -> list[tuple[str, int]]:
    """What dead workers leave behind: registered, reserved with a tiny lease, never renewed.

    Through the store itself (register + outbox row + reserve), in one transaction.
    Returns (operation id, the generation that went stale).
    """
    made = []
    with engine.begin() as conn:
        for tool_name, arguments in calls:
            operation_id = f"op-{uuid.uuid4().hex[:16]}"
            request_id = f"req-{operation_id}"
            tool = registry.get(tool_name)
            assert tool is not None
            outcome = store.register(
                conn,
                store.NewOperation(
                    operation_id=operation_id, request_id=request_id, call_id="c1", position=0,
                    tool_name=tool_name, schema_version=tool.schema_version, mode=tool.mode.value,
                    intent_hash=hashlib.sha256(operation_id.encode()).hexdigest(),
                    arguments=arguments,
                    context={**ACME.to_json(), "request_id": request_id},
                    needs_approval=False, impact=None,
                ),
            )
            assert isinstance(outcome, store.Created)
            store.add_outbox_row(conn, operation_id)
            reservation = store.reserve(conn, operation_id, store.new_owner_token(), lease_seconds)
            assert reservation is not None
            made.append((operation_id, reservation.generation))
    return made


def wait_leases_expired(engine: Engine, timeout: float = 10.0) -> None:
    def none_live() -> bool:
        with engine.connect() as conn:
            return conn.execute(
                select(func.count()).where(
                    operations.c.state == "started",
                    operations.c.lease_expires_at >= store.DATABASE_CLOCK.now(),
                )
            ).scalar_one() == 0

    wait_until(none_live, timeout=timeout, what="every lease to expire", interval=0.02)


# ------------------------------------------------------------------ reading what happened


def operation(engine: Engine, operation_id: str) -> Row[Any]:
    with engine.connect() as conn:
        row = store.get_operation(conn, operation_id)
    assert row is not None, operation_id
    return row


def state_of(engine: Engine, operation_id: str) -> str:
    return str(operation(engine, operation_id).state)


def audit(engine: Engine, operation_id: str) -> list[Row[Any]]:
    with engine.connect() as conn:
        return store.audit_trail(conn, operation_id)


def transitions_out_of_stale(engine: Engine) -> dict[tuple[str, int], int]:
    """Per (operation, generation): audit events that moved it out of `started`."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(audit_events.c.operation_id, audit_events.c.generation, func.count())
            .where(audit_events.c.from_state == "started")
            .group_by(audit_events.c.operation_id, audit_events.c.generation)
        ).all()
    return {(r[0], r[1]): int(r[2]) for r in rows}


def receipt_rows(engine: Engine, operation_id: str) -> list[Row[Any]]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(receipts)
                .where(receipts.c.operation_id == operation_id)
                .order_by(receipts.c.receipt_row_id)
            )
        )


def ledger_effect_rows(engine: Engine, operation_id: str) -> list[Row[Any]]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(ledger_service.effects).where(
                    ledger_service.effects.c.operation_id == operation_id
                )
            )
        )


def owner_pid(engine: Engine, operation_id: str) -> int | None:
    token = operation(engine, operation_id).owner_token
    return int(token.split("-", 1)[0]) if token else None


# ------------------------------------------------------------------ processes


def kill_worker_group(fleet: Fleet, index: int = 0) -> list[int]:
    """SIGKILL a worker's main process and its pool children (its whole process group)."""
    [member] = [m for m in fleet.by_role("worker") if m.index == index]
    pids = [member.pid, *children_of(member.pid)]
    os.killpg(member.pid, signal.SIGKILL)
    member.process.wait(10)
    wait_until(
        lambda: not any(process_alive(pid) for pid in pids), timeout=10,
        what=f"worker processes {pids} to die",
    )
    return pids


def toolfence(
    env: Mapping[str, str], *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the `toolfence` command as an operator would, in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "executor.cli", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
    )


def start_toolfence(env: Mapping[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "executor.cli", *args],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


# ------------------------------------------------------------------ metrics


def counter(metrics_dir: str, name: str, **labels: str) -> float:
    """A counter summed over every process that wrote to the multiprocess directory."""
    collector = CollectorRegistry()
    collector.register(MultiprocessTreeCollector(metrics_dir))
    return sum(
        sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        body = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not on the page"
    return samples[key]
