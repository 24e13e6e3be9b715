"""`toolfence serve --workers N`: N server processes on one port.

The supervisor (the process `toolfence serve` started as) binds N listening
sockets on the port with SO_REUSEPORT, one per worker, and starts N workers with
the `spawn` method: each is a fresh interpreter that imports the application
itself, so nothing the supervisor loaded (a tool module's threads, a database
connection) is shared by a fork. The kernel spreads new connections over the N
sockets by their addresses' hash. (One shared socket let whichever worker woke
first accept every pending connection at once: a client or a proxy opening its
keep-alive connections together had them all on one worker.) Where SO_REUSEPORT
does not exist, the workers share one socket. A worker's socket outlives it: a
replacement accepts the connections queued meanwhile. What the supervisor does
(decision 0228):

- **SIGTERM or SIGINT**: it sends SIGTERM to every worker; each stops accepting,
  tells its long-polls to answer, drains its requests in flight (up to
  `TOOLFENCE_HTTP_DRAIN_SECONDS`) and exits 0. A worker still running
  `drain_seconds + 10` s later is killed. The supervisor exits 0 when every worker
  stopped cleanly, 1 otherwise.
- **A worker that dies** (killed, crashed) after it started serving is replaced
  by a new one on the same socket; its connections in flight are lost (a client
  retries: POSTs with an Idempotency-Key are replayed, not done twice). More than
  `MAX_RESTARTS` deaths within `RESTART_WINDOW_SECONDS` is a crash loop: the
  supervisor stops the others and exits 1, so a process manager sees it.
- **A worker that dies before it serves** (bad settings, an unloadable tools
  module, the database unreachable at start) would die the same way again: the
  supervisor stops the others and exits 1.
- **The supervisor dies** (SIGKILL): each worker notices its parent changed within
  a second and stops as on SIGTERM, so no orphan keeps the port.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

log = logging.getLogger("toolfence.serve")

MAX_RESTARTS = 5
RESTART_WINDOW_SECONDS = 60.0
POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 10.0

WorkerTarget = Callable[..., None]
"""A module-level function the worker runs: `target(*args, sock, started)`, where
`started()` is to be called once it listens (spawn pickles it by reference)."""


def bind(host: str, port: int, count: int = 1) -> list[socket.socket]:
    """`count` listening sockets on one port, SO_REUSEPORT (one shared socket where
    the platform has none), SO_REUSEADDR as uvicorn binds. Port 0: the first socket's
    port, chosen by the kernel, for all.

    Made with protocol IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted
    sockets whose `proto` says TCP, and an accepted socket copies the listener's.
    Without it, Nagle's algorithm held each response's body until the client's
    delayed ACK of its headers: 40 ms a request, half the throughput of one process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reuse_port = getattr(socket, "SO_REUSEPORT", None)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count if reuse_port is not None else 1):
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port is not None:
                sock.setsockopt(socket.SOL_SOCKET, reuse_port, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(2048)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


@dataclass
class _Worker:
    process: BaseProcess
    ready: Connection
    started: bool = False


@dataclass
class Supervisor:
    """Runs `count` workers of `target(*args)` until told to stop, worker i on
    `sockets[i]` (on `sockets[0]` when there is one socket for all)."""

    count: int
    sockets: list[socket.socket]
    target: WorkerTarget
    args: tuple[Any, ...]
    drain_seconds: float
    _workers: list[_Worker] = field(default_factory=list)
    _deaths: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (0) or a worker failure it will not repair (1)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._workers = [self._start(slot) for slot in range(self.count)]
            failed = self._watch()
            clean = self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if failed or not clean else 0

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def _start(self, slot: int) -> _Worker:
        context = multiprocessing.get_context("spawn")
        receiving, sending = context.Pipe(duplex=False)
        sock = self.sockets[slot % len(self.sockets)]
        process = context.Process(
            target=_worker_main, args=(self.target, self.args, sock, sending, os.getpid()),
            name="toolfence-serve-worker", daemon=False,
        )
        process.start()
        sending.close()  # the child's end: closed here, so its death reads as EOF
        return _Worker(process, receiving)

    def _watch(self) -> bool:
        """Watch the workers until told to stop (False) or one failed beyond repair (True)."""
        while not self._stop.wait(POLL_SECONDS):
            for index, worker in enumerate(self._workers):
                if not worker.started and worker.ready.poll():
                    try:
                        worker.ready.recv()
                        worker.started = True
                    except (EOFError, OSError):
                        pass
                if worker.process.is_alive() or self._stop.is_set():
                    continue
                worker.process.join()
                code = worker.process.exitcode
                if not worker.started:
                    log.error(
                        "toolfence serve: worker %s exited %s before serving; stopping",
                        worker.process.pid, code,
                    )
                    return True
                now = time.monotonic()
                self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_SECONDS] + [now]
                if len(self._deaths) > MAX_RESTARTS:
                    log.error(
                        "toolfence serve: %d workers died within %.0f s; stopping",
                        len(self._deaths), RESTART_WINDOW_SECONDS,
                    )
                    return True
                log.warning(
                    "toolfence serve: worker %s exited %s; starting another", worker.process.pid, code
                )
                worker.ready.close()
                self._workers[index] = self._start(index)
        return False

    def _stop_all(self) -> bool:
        """SIGTERM every worker, wait for each to drain; True when all exited 0."""
        for worker in self._workers:
            if worker.process.is_alive() and worker.process.pid is not None:
                try:
                    os.kill(worker.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.drain_seconds + STOP_GRACE_SECONDS
        clean = True
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.error("toolfence serve: worker %s did not stop in time; killing it", worker.process.pid)
                worker.process.kill()
                worker.process.join()
                clean = False
            elif worker.process.exitcode != 0 and worker.started:
                clean = False
            worker.ready.close()
        return clean


def _worker_main(
    target: WorkerTarget, args: tuple[Any, ...], sock: socket.socket, ready: Connection, parent: int
) -> None:
    """A worker process: stop when the supervisor is gone; run `target` on `sock`."""

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)  # orphaned: drain and exit

    threading.Thread(target=watch_parent, name="toolfence-parent-watch", daemon=True).start()

    def started() -> None:
        try:
            ready.send(os.getpid())
        except OSError:
            pass

    target(*args, sock, started)
