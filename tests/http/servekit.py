"""Helpers for `toolfence serve` tests (tests/http and tests/fleet): a free port,
uvicorn in a thread, `toolfence serve` as a subprocess, and a handle on a server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from sqlalchemy import Engine

from executor.http.keys import KeyScope, create_key
from executor.settings import Settings
from tests.netkit import free_port as free_port  # re-exported: `from servekit import free_port`


@dataclass
class Served:
    url: str
    engine: Engine
    settings: Settings

    def key(
        self, tenant: str, principal: str, *scopes: KeyScope, roles: tuple[str, ...] = ("member",),
        surface: str | None = None,
    ) -> str:
        with self.engine.begin() as conn:
            return create_key(
                conn, tenant=tenant, principal=principal, roles=roles, scopes=scopes, surface=surface
            )

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def start_in_thread(app: object, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.02)
    return server, thread


def serve_subprocess(env: dict[str, str], port: int, log: Path, *options: str) -> subprocess.Popen[bytes]:
    """`toolfence serve` as a real process (`options` added to its command line, such
    as `--workers 2`), waited for until /healthz answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "executor.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
         *options],
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise AssertionError(f"toolfence serve exited {process.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"toolfence serve did not answer: {log.read_text()}")
        time.sleep(0.1)


def worker_pids(supervisor: int) -> list[int]:
    """The server processes of `toolfence serve --workers N` (started with `spawn`:
    the supervisor's children running `spawn_main`, not multiprocessing's resource
    tracker)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    pids = []
    for child in children:
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in command:
            pids.append(int(child))
    return sorted(pids)
