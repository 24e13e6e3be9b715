"""`toolfence demo --serve`: the operator console beside the demo's fleet.

Once the demo's schema exists, `toolfence serve` starts on the demo's database
(log: `logs/serve-0.log` in the run directory), a key of tenant `acme` with the
`approve`, `operate` and `read` scopes is created for an approver, and the
console's URL and that key are printed. The server stays up while the demo runs
(its approvals and the `reconciliation_pending` queue show up as they happen)
and after the report, until Ctrl-C or SIGTERM. The demo decides its own
approvals, so after the report it leaves work for the person at the console
(`leave_for_a_person`): two transfers from one account waiting for approval
(approve one and, once it has run, the other card's impact follows: decision
0218), and an unsafe notice whose outcome toolfence does not know, for "Needs a
person". The fleet keeps running while the console is up, so what the person
approves runs. Without `--serve` nothing here runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console

from executor.cli.demo.constants import STOP, _Terminated, pause
from executor.cli.demo.place import Place
from executor.store.engine import make_engine

APPROVER = "demo-approver"
# What the demo leaves for the person at the console: two transfers from one account
# (both above the ledger's approval threshold), and one notice of unknown outcome.
LEFT_ACCOUNT = "acme-operating"
LEFT_TRANSFERS = (("acme-reserve", 7_500_000), ("acme-vendors", 6_000_000))
LEFT_OWNER = "demo-console"


@dataclass
class DemoConsole:
    place: Place
    console: Console
    port: int | None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/console"

    def start(self) -> None:
        """Start the server and print how to sign in (the schema must exist)."""
        if self.port is None:
            return
        from executor.http.keys import KeyScope, create_key

        logs = self.place.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / "serve-0.log").open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "executor.cli", "serve", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self._wait_healthy()
        engine = make_engine(self.place.database_url)
        try:
            with engine.begin() as conn:
                key = create_key(
                    conn, tenant="acme", principal=APPROVER, roles=("approver",),
                    scopes=(KeyScope.APPROVE, KeyScope.OPERATE, KeyScope.READ), label="toolfence demo",
                )
        finally:
            engine.dispose()
        self.console.print(f"  console [bold]{self.url}[/] — sign in with the key {key}")

    def _wait_healthy(self, timeout: float = 30.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"toolfence serve exited {self.process.returncode} (see logs/serve-0.log)")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"toolfence serve did not answer on port {self.port} (see logs/serve-0.log)")

    def leave_for_a_person(self) -> None:
        """Two approvals and one notice of unknown outcome for the person at the console
        (the demo decides its own approvals, so the console would otherwise be empty)."""
        if self.process is None:
            return
        from executor import store
        from executor.core.types import ProposedCall, ServerContext
        from ledger.tools import registry
        from outbox.producer import enqueue

        def requester(request_id: str) -> ServerContext:
            return ServerContext(
                principal="alice@acme", tenant="acme", roles=frozenset({"member"}), request_id=request_id
            )

        engine = make_engine(self.place.database_url)
        try:
            for index, (target, cents) in enumerate(LEFT_TRANSFERS, start=1):
                call = ProposedCall(
                    call_id=f"left-transfer-{index}", tool_name="ledger.transfer",
                    arguments=json.dumps(
                        {"source_account": LEFT_ACCOUNT, "target_account": target, "amount_cents": cents}
                    ),
                )
                with engine.begin() as conn:
                    enqueue(conn, [call], requester(f"demo-left-transfer-{index}"), registry)
            notice = ProposedCall(
                call_id="left-notice", tool_name="ledger.send_notice",
                arguments=json.dumps({"account_id": LEFT_ACCOUNT, "text": "Your statement is ready"}),
            )
            # One transaction: the notice is admitted, reserved and its outcome recorded
            # as unknown before its message can reach a worker (which then finds nothing
            # to run), as when a worker dies inside the downstream call.
            with engine.begin() as conn:
                handle = enqueue(conn, [notice], requester("demo-left-notice"), registry)
                operation_id = handle.calls[0].operation_id
                assert operation_id is not None
                reservation = store.reserve(conn, operation_id, LEFT_OWNER, 30.0)
                assert reservation is not None
                store.mark_unknown(
                    conn, operation_id, reservation.generation, owner_token=LEFT_OWNER,
                    reason="left for you by the demo: did the notice go out? check, then say so",
                )
        finally:
            engine.dispose()
        self.console.print(
            f"Left for you at {self.url}: {len(LEFT_TRANSFERS)} transfers from {LEFT_ACCOUNT} waiting for "
            "approval (approve one; once it has run, the other's impact shows the new balance) and "
            "1 notice whose outcome is unknown, under Needs a person."
        )

    def hold(self) -> None:
        """Keep the console up after the report until Ctrl-C or SIGTERM."""
        if self.process is None:
            return
        self.console.print(f"The console stays up at {self.url}: Ctrl-C to stop.")
        try:
            while self.process.poll() is None:
                pause(0.5)
        except (KeyboardInterrupt, _Terminated):
            STOP.signum = None  # the way to end the console, not an interrupt of the demo

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


@contextmanager
def demo_console(place: Place, console: Console, port: int | None) -> Iterator[DemoConsole]:
    served = DemoConsole(place, console, port)
    try:
        yield served
    finally:
        served.stop()
