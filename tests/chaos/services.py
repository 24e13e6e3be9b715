"""Private PostgreSQL and Redis servers for one chaos campaign.

The campaign restarts PostgreSQL (`-m immediate`) and kills Redis, so it never
touches the shared servers other tests use: each run gets its own cluster and
its own `redis-server`, on free loopback ports, in its own directories, and
removes them afterwards. The partitions campaign (`tests/chaos/partitions.py`)
runs the same servers inside a network namespace: `host` is then the address
they listen on there, `prefix` the command that enters the namespace
(`ip netns exec NAME`), and the harness itself reaches them through their Unix
sockets (filesystem paths, which no network namespace hides).

PostgreSQL refuses to run as root, so its binaries run as the `postgres` user
when we are root. `fsync=off` is safe here: an immediate shutdown is a process
crash, not an OS crash, and the kernel keeps every write we made.
`synchronous_commit` stays on, so an acknowledged commit survives the restart —
the campaign must never count a loss the real system would not have.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg

from tests.netkit import free_port

PG_BIN = Path(os.environ.get("TOOLFENCE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def _pg_user() -> tuple[int, int] | None:
    """(uid, gid) to run PostgreSQL as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam(os.environ.get("TOOLFENCE_PG_OS_USER", "postgres"))
    return entry.pw_uid, entry.pw_gid


@dataclass
class PrivatePostgres:
    """One initdb'd cluster, started and restarted with pg_ctl."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="toolfence-chaos-pg-")))
    restarts: int = 0
    # Where it listens, and what runs its binaries in a network namespace (empty: here).
    host: str = "127.0.0.1"
    prefix: list[str] = field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    def _run(self, *args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        ids = _pg_user()
        if self.prefix:
            # Entering a namespace needs root, so the user changes after it, with setpriv.
            drop = ([f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups"] if ids else [])
            return subprocess.run(
                [*self.prefix, "setpriv", *drop, "--", *args], check=check, timeout=timeout,
                capture_output=True, text=True, cwd=self.root,
            )
        return subprocess.run(
            list(args), check=check, timeout=timeout, capture_output=True, text=True,
            user=ids[0] if ids else None, group=ids[1] if ids else None,
            cwd=self.root,
        )

    def start(self) -> PrivatePostgres:
        ids = _pg_user()
        if ids:
            os.chown(self.root, *ids)
        os.chmod(self.root, 0o755)
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
            "--no-sync", "-E", "UTF8", "--locale=C",
        )
        if self.host != "127.0.0.1":
            # Nodes on the namespace's subnet connect over TCP (initdb trusts loopback only).
            with (self.data_dir / "pg_hba.conf").open("a") as hba:
                hba.write("host all all samenet trust\n")
        options = " ".join(
            [
                f"-p {self.port}",
                f"-c listen_addresses={self.host}",
                f"-c unix_socket_directories={self.root}",
                "-c max_connections=400",
                "-c fsync=off",
                "-c synchronous_commit=on",
                "-c shared_buffers=128MB",
                "-c log_min_messages=warning",
                # Idle-in-transaction sessions of a SIGSTOPped worker must not hold
                # locks forever; the lease has long expired by then anyway.
                "-c idle_in_transaction_session_timeout=60s",
            ]
        )
        (self.root / "options").write_text(options)
        self._pg_ctl_start()
        return self

    def _pg_ctl_start(self) -> None:
        options = (self.root / "options").read_text()
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
            "-o", options, "-w", "-t", "60", "start",
        )
        self.wait_ready(60)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.admin_dsn, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop_immediate(self) -> None:
        """Crash-stop: the postmaster and every backend die at once (SIGQUIT)."""
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop",
                  check=False)

    def restart_immediate(self, down_seconds: float = 0.0) -> None:
        self.stop_immediate()
        if down_seconds:
            time.sleep(down_seconds)
        self._pg_ctl_start()
        self.restarts += 1

    @property
    def admin_dsn(self) -> str:
        if self.prefix:  # the harness is outside the namespace: the Unix socket
            return f"postgresql://postgres@{quote(str(self.root), safe='')}:{self.port}/postgres"
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def url(self, database: str, *, port: int | None = None, application_name: str | None = None) -> str:
        """The harness's URL: over TCP here, or the Unix socket when in a namespace."""
        if self.prefix:
            url = f"postgresql+psycopg://postgres@/{database}?host={self.root}&port={self.port}"
            return url + (f"&application_name={application_name}" if application_name else "")
        return self.node_url(database, port=port, application_name=application_name)

    def node_url(self, database: str, *, port: int | None = None,
                 application_name: str | None = None) -> str:
        """The URL of a process that reaches the server over the network, at `host`."""
        url = f"postgresql+psycopg://postgres@{self.host}:{port or self.port}/{database}"
        if application_name:
            url += f"?application_name={application_name}"
        return url

    def destroy(self) -> None:
        self.stop_immediate()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class PrivateRedis:
    """A `redis-server` we may SIGKILL, with persistence off or with AOF on."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="toolfence-chaos-redis-")))
    aof: bool = True
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0
    host: str = "127.0.0.1"
    prefix: list[str] = field(default_factory=list)

    @property
    def socket_path(self) -> Path:
        return self.root / "redis.sock"

    def start(self, *, aof: bool | None = None) -> PrivateRedis:
        if aof is not None:
            self.aof = aof
        if not self.aof:
            # Persistence off: whatever an earlier AOF run left must not come back.
            shutil.rmtree(self.root / "data", ignore_errors=True)
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        log = (self.root / "redis.log").open("ab")
        # `ip netns exec` execs redis-server in place: the Popen's pid is the server's.
        self.process = subprocess.Popen(
            [
                *self.prefix,
                "redis-server", "--port", str(self.port), "--bind", self.host,
                "--unixsocket", str(self.socket_path), "--unixsocketperm", "700",
                "--dir", str(self.root / "data"), "--save", "",
                "--appendonly", "yes" if self.aof else "no", "--appendfsync", "everysec",
                "--daemonize", "no", "--protected-mode", "no",
            ],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        self.wait_ready(20)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: see {self.root / 'redis.log'}")
            try:
                with self._connect() as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server not ready on {self.port}")

    def _connect(self) -> socket.socket:
        if self.prefix:  # in a namespace: the harness uses the Unix socket
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(0.5)
            try:
                sock.connect(str(self.socket_path))
            except OSError:
                sock.close()
                raise
            return sock
        return socket.create_connection(("127.0.0.1", self.port), timeout=0.5)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.kills += 1

    def restart(self, *, aof: bool, down_seconds: float = 0.0) -> None:
        self.kill()
        if down_seconds:
            time.sleep(down_seconds)
        self.start(aof=aof)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def destroy(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
