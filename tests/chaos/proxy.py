"""A small TCP proxy that injects network faults (a process of its own).

Workers reach PostgreSQL and Redis through it, so the campaign can put a fault
on exactly that path while the relay, the reconciler and the harness itself
keep a direct connection. Each named route forwards one listening port to one
upstream address, in one of four modes:

- `pass`: forward bytes as they come;
- `latency`: hold every chunk `latency_ms` before forwarding it, each way;
- `blackhole`: forward nothing and connect nothing (a partition): bytes already
  read are held, the kernel's buffers fill, and everything flows again, in
  order, when the route leaves the mode — the way TCP survives a short partition;
- `reset`: abort every open connection with a TCP RST and reset new ones.

Run `python -m tests.chaos.proxy --route pg=127.0.0.1:5432 …`; it prints one
JSON line `{"pg": <port>, …}` when listening, then reads one JSON command per
line on stdin (`{"route": "pg", "mode": "latency", "latency_ms": 200}`) and
answers `ok` or an error line. `ProxyControl` is the campaign's side of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

MODES = ("pass", "latency", "blackhole", "reset")


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer sees ECONNRESET, not a clean end of stream."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter

    def reset(self) -> None:
        _rst(self.client)
        _rst(self.upstream)


@dataclass(eq=False)
class Route:
    name: str
    upstream_host: str
    upstream_port: int
    mode: str = "pass"
    latency: float = 0.0
    open_: asyncio.Event = field(default_factory=asyncio.Event)
    connections: set[_Connection] = field(default_factory=set)
    accepted: int = 0

    def __post_init__(self) -> None:
        self.open_.set()

    def set_mode(self, mode: str, latency_ms: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.mode, self.latency = mode, latency_ms / 1000.0
        if mode == "blackhole":
            self.open_.clear()
        else:
            self.open_.set()
        if mode == "reset":
            for connection in list(self.connections):
                connection.reset()
            self.connections.clear()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "blackhole":
            await self.open_.wait()  # a partition: the connect hangs until it heals
        if self.mode == "reset":
            _rst(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            _rst(writer)
            return
        connection = _Connection(writer, up_writer)
        self.connections.add(connection)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
            )
        finally:
            self.connections.discard(connection)
            for end in (writer, up_writer):
                with contextlib.suppress(Exception):
                    end.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await source.read(65536)
                if not data:
                    break
                while self.mode == "blackhole":
                    await self.open_.wait()
                if self.mode == "latency" and self.latency:
                    await asyncio.sleep(self.latency)
                if sink.is_closing():
                    break
                sink.write(data)
                await sink.drain()
        finally:
            # One direction ended (or was reset): end the other one too.
            with contextlib.suppress(Exception):
                sink.close()


async def _serve(routes: dict[str, Route]) -> None:
    loop = asyncio.get_running_loop()
    ports: dict[str, int] = {}
    servers = []
    for name, route in routes.items():
        server = await asyncio.start_server(route.handle, "127.0.0.1", 0, backlog=512)
        servers.append(server)
        ports[name] = server.sockets[0].getsockname()[1]
    print(json.dumps(ports), flush=True)

    done = asyncio.Event()

    def apply(line: str) -> None:
        try:
            command = json.loads(line)
            if command.get("stats"):
                reply = json.dumps({n: {"mode": r.mode, "open": len(r.connections), "accepted": r.accepted}
                                    for n, r in routes.items()})
            else:
                routes[command["route"]].set_mode(command["mode"], float(command.get("latency_ms", 0)))
                reply = "ok"
        except Exception as exc:  # a bad command must not take the proxy down
            reply = f"error {type(exc).__name__}: {exc}"
        print(reply, flush=True)

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(apply, line)
        loop.call_soon_threadsafe(done.set)  # the campaign went away: so do we

    threading.Thread(target=read_stdin, daemon=True).start()
    await done.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", action="append", required=True, metavar="NAME=HOST:PORT")
    args = parser.parse_args(argv)
    routes = {}
    for spec in args.route:
        name, _, address = spec.partition("=")
        host, _, port = address.rpartition(":")
        routes[name] = Route(name, host, int(port))
    asyncio.run(_serve(routes))
    return 0


class ProxyControl:
    """Starts the proxy process and switches its routes' modes."""

    def __init__(self, upstreams: dict[str, tuple[str, int]], log_path: Any = None) -> None:
        args = [sys.executable, "-m", "tests.chaos.proxy"]
        for name, (host, port) in upstreams.items():
            args += ["--route", f"{name}={host}:{port}"]
        self._log = open(log_path, "ab") if log_path else None  # noqa: SIM115
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL, text=True, bufsize=1,
        )
        assert self.process.stdout is not None
        self.ports: dict[str, int] = json.loads(self.process.stdout.readline())
        self._lock = threading.Lock()
        self.modes: dict[str, str] = {name: "pass" for name in upstreams}

    def _send(self, command: dict[str, Any]) -> str:
        with self._lock:
            assert self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
            reply = self.process.stdout.readline().strip()
        if reply.startswith("error") or not reply:
            raise RuntimeError(f"proxy: {reply or 'no reply'}")
        return reply

    def set(self, route: str, mode: str, latency_ms: float = 0.0) -> None:
        self._send({"route": route, "mode": mode, "latency_ms": latency_ms})
        self.modes[route] = mode

    def heal_all(self) -> None:
        for route in self.modes:
            self.set(route, "pass")

    def stats(self) -> dict[str, Any]:
        return dict(json.loads(self._send({"stats": True})))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        if self._log is not None:
            self._log.close()


if __name__ == "__main__":
    sys.exit(main())
