"""Ports and refused connections for the test suite.

`free_port()` binds port 0 on 127.0.0.1, reads the port the kernel chose and
closes the socket: a port nothing listens on (for a moment), to start a private
server on. `refused_database_url()` points a PostgreSQL client at such a port,
so that connecting is refused for real (a database, a directory, a ledger that
is down), with a password in it that no error may repeat (`REFUSED_PASSWORD`).
`Directory` is what a tool's hook or an application's role resolver reads: a
real PostgreSQL server while `up`, a refused port while not.
`terminate_backend(pid)` kills a PostgreSQL session for real and waits until the
server has let it go. `stop_process(process)` ends a server a test started:
SIGTERM, then SIGKILL if it has not exited within 20 s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Engine, text

from executor.store.engine import make_engine

REFUSED_PASSWORD = "hunter2"
PG_ADMIN_DSN = os.environ.get("TOOLFENCE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def terminate_backend(pid: int) -> None:
    """`pg_terminate_backend`, then wait (5 s at most) until the session is gone."""
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 5
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, f"backend {pid} still there"
            time.sleep(0.01)


def stop_process(process: subprocess.Popen[Any]) -> int:
    """SIGTERM, then SIGKILL after 20 s; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    return int(process.returncode)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refused_database_url(name: str = "directory") -> str:
    return f"postgresql+psycopg://{name}:{REFUSED_PASSWORD}@127.0.0.1:{free_port()}/{name}"


@dataclass
class Directory:
    """`ask()` runs a query on the server while `up`, on a refused port while not
    (a real connection refused, not a raised stand-in); `raise_instead` makes it
    raise that exception instead (a hook's own bug). `authorizes` is `ask` with a
    hook's signature; `roles` is a role resolver that asks first."""

    up_url: str
    up: bool = True
    raise_instead: BaseException | None = None
    down_url: str = field(default_factory=refused_database_url)
    _engines: dict[bool, Engine] = field(default_factory=dict)

    def ask(self) -> bool:
        if self.raise_instead is not None:
            raise self.raise_instead
        if self.up not in self._engines:
            self._engines[self.up] = make_engine(self.up_url if self.up else self.down_url)
        with self._engines[self.up].connect() as conn:
            return bool(conn.execute(text("SELECT true")).scalar_one())

    def authorizes(self, args: Any, ctx: Any) -> bool:
        return self.ask()

    def roles(self, ctx: Any) -> list[str]:
        return ["approver", "member"] if self.ask() else []

    def dispose(self) -> None:
        for engine in self._engines.values():
            engine.dispose()


__all__ = ["REFUSED_PASSWORD", "Directory", "free_port", "refused_database_url"]
