"""Redis shut down without saving mid-run: its queued messages are gone, the operations are not.

The operations live in PostgreSQL; the broker only carries their ids. After
`redis-cli shutdown nosave` and a restart, every message that was waiting is
lost, and the reconciler republishes the `queued` operations whose message
never came (`TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS`), and requeues or looks
up those whose worker was interrupted.

The Redis shut down here is a private instance on a free port, started with the
same options as the shared one (no RDB snapshots, no AOF): shutting down the
shared server would break whatever else is using it at the same time (other
engineers' fleet tests). The fixture stops it at the end whatever happens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reconciler_kit import (
    ACME,
    TOOLS_ENV,
    audit,
    counter,
    ledger_effect_rows,
    logs_on_failure,
    operation,
    wait_until,
)
from sqlalchemy import select

from executor.cli.fleet import Fleet
from executor.core.types import ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import operations
from ledger.service import Ledger
from ledger.tools import registry
from outbox.producer import enqueue
from tests.netkit import free_port

MakeFleet = Callable[..., Fleet]


class PrivateRedis:
    """A redis-server of this test's own: no snapshots, no AOF, like the shared one."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10
        )

    def ping(self) -> bool:
        return self._cli("ping").stdout.strip() == "PONG"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1",
                "--port", str(self.port), "--save", "", "--appendonly", "no",
                "--dir", str(self.directory), "--logfile", str(self.directory / "redis.log"),
                "--pidfile", str(self.directory / "redis.pid"),
            ],
            check=True, timeout=10,
        )
        wait_until(self.ping, timeout=10, what=f"redis on port {self.port} to answer")

    def shutdown_nosave(self) -> None:
        self._cli("shutdown", "nosave")
        wait_until(lambda: not self.ping(), timeout=10, what=f"redis on port {self.port} to stop")

    def queue_length(self, queue: str) -> int:
        return int(self._cli("llen", queue).stdout.strip() or 0)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server and redis-cli are required for the Redis restart test")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    # Whatever happened in the test: stop it (it was restarted at most once).
    if server.ping():
        server.shutdown_nosave()


def test_redis_restarted_without_saving__reconciler_republishes__every_operation_terminal_once(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet, fleet_env: dict[str, str],
    private_redis: PrivateRedis,
) -> None:
    engine = make_engine(settings.database_url)
    metrics_dir = settings.metrics_dir or ""
    # Given a fleet on Redis working through 60 calls of every retry-safe contract,
    # slowly enough (150 ms per ledger call) that most are still waiting in Redis
    fleet = make_fleet(
        workers=2, concurrency=2, relays=1, reconcile_every=0.5,
        env={
            **TOOLS_ENV,
            "TOOLFENCE_BROKER_URL": private_redis.url,
            "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": "2",
            "TOOLFENCE_LEDGER_LATENCY_MS": "150",
        },
    ).start()
    with logs_on_failure(fleet):
        kinds = [
            ("ledger.credit", {"account_id": "acme-2", "amount_cents": 10}),
            ("ledger.transfer", {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 5}),
            ("ledger.create_invoice", {"account_id": "acme-1", "amount_cents": 99}),
            ("ledger.get_balance", {"account_id": "acme-1"}),
        ]
        operation_ids: dict[str, str] = {}
        with engine.begin() as conn:
            for index in range(60):
                tool, arguments = kinds[index % len(kinds)]
                request_id = f"req-{uuid.uuid4().hex[:12]}"
                ctx = ServerContext(
                    principal=ACME.principal, tenant=ACME.tenant, roles=ACME.roles, request_id=request_id
                )
                call = ProposedCall(call_id="c1", tool_name=tool, arguments=json.dumps(arguments))
                [admitted] = enqueue(conn, [call], ctx, registry).calls
                assert admitted.operation_id is not None
                operation_ids[admitted.operation_id] = tool

        def count_in(*states: str) -> int:
            with engine.connect() as conn:
                rows = conn.execute(
                    select(operations.c.state).where(operations.c.operation_id.in_(operation_ids))
                ).scalars().all()
            return sum(1 for state in rows if state in states)

        wait_until(lambda: count_in("succeeded") >= 3, timeout=20, what="the first results")
        waiting = private_redis.queue_length(fleet_env["TOOLFENCE_QUEUE"])
        # When Redis is shut down without saving, and started again a second later
        private_redis.shutdown_nosave()
        time.sleep(1.0)
        private_redis.start()
        # Then every operation reaches a terminal state after reconciliation
        wait_until(lambda: count_in("succeeded", "failed_terminal") == len(operation_ids), timeout=60,
                   what="every operation to be terminal")
        not_succeeded = [
            (operation_id, tool, row.state, row.error_code, row.error, row.attempts,
             [(event.from_state, event.to_state, event.decision_code, event.generation, event.actor)
              for event in audit(engine, operation_id)])
            for operation_id, tool in operation_ids.items()
            if (row := operation(engine, operation_id)).state != "succeeded"
        ]
        assert not_succeeded == []
        # ... and some did so only because the reconciler republished their lost message
        assert waiting > 0, "nothing was waiting in Redis: the test did not lose any message"
        assert counter(metrics_dir, "toolfence_reconciler_actions_total", action="republished_queued") > 0
        # And every write took effect exactly once, every read none
        for operation_id, tool in operation_ids.items():
            effects = ledger_effect_rows(engine, operation_id)
            assert len(effects) == (0 if tool == "ledger.get_balance" else 1), (operation_id, tool)
        assert ledger.balance("acme-2") == 15 * 10 + 15 * 5
