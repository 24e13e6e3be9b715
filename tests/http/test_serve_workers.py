"""`toolfence serve --workers N` as real processes on PostgreSQL and Redis: both
workers answer, the rate limit is one budget across them (Redis), a revoked key is
refused by every worker on its next request though each had it cached, SIGTERM and
SIGINT stop every worker, a SIGKILLed worker is replaced, and memory:// storage
with more than one worker is refused at start (decision 0228)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from servekit import free_port, serve_subprocess, worker_pids

from ledger.service import Ledger

pytestmark = pytest.mark.slow

REDIS_URL = os.environ.get("TOOLFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
BALANCE = {
    "calls": [{"call_id": "c1", "tool_name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}]
}


@pytest.fixture
def env(pg_url: str, book: Ledger, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "metrics").mkdir()
    return {
        "TOOLFENCE_DATABASE_URL": pg_url,
        "TOOLFENCE_BROKER_URL": f"filesystem://{tmp_path / 'broker'}",
        "TOOLFENCE_TOOLS": "ledger.tools:registry",
        "TOOLFENCE_HOME": str(tmp_path / "home"),
        "TOOLFENCE_HTTP_RATE_LIMIT_STORAGE": REDIS_URL,
        "TOOLFENCE_HTTP_RATE_LIMIT": "100000/minute",
        # This file's refusals are expected; other suites share the address's bucket.
        "TOOLFENCE_HTTP_AUTH_FAILURE_LIMIT": "100000/minute",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
        "TOOLFENCE_HTTP_DRAIN_SECONDS": "5",
    }


def toolfence(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "executor.cli.main", *args], env={**os.environ, **env},
        capture_output=True, text=True, timeout=60,
    )


def make_key(env: dict[str, str]) -> str:
    made = toolfence(
        env, "keys", "create", "--tenant", "acme", "--principal", "alice", "--role", "member",
        "--scope", "produce,read",
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


class TwoWorkers(NamedTuple):
    server: subprocess.Popen[bytes]
    base: str
    key: str
    pids: list[int]


def start_two_workers(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`toolfence serve --workers 2`, once both worker processes serve: it and its URL.

    Serving, not only running: a worker killed before it told the supervisor it
    listens is one that would die again at start, and the supervisor stops (decision
    0228). On a loaded machine a worker's start outlasts the first /healthz answer."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = serve_subprocess(env, port, log, "--workers", "2")
    metrics = Path(env["PROMETHEUS_MULTIPROC_DIR"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = worker_pids(server.pid)
        if len(pids) == 2 and all(answered_by(metrics, "/healthz").get(pid, 0) > 0 for pid in pids):
            break
        with httpx.Client(base_url=base, timeout=30) as client:  # a fresh connection: either worker
            client.get("/healthz")
    else:
        server.kill()
        server.wait()
        raise AssertionError(f"both workers did not answer /healthz: {log.read_text()}")
    return server, base


def gone(pid: int) -> bool:
    """No such process, or only its zombie left."""
    return not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.fixture
def two_workers(env: dict[str, str], tmp_path: Path) -> Iterator[TwoWorkers]:
    server, base = start_two_workers(env, tmp_path / "serve.log")
    yield TwoWorkers(server, base, make_key(env), worker_pids(server.pid))
    if server.poll() is None:
        server.kill()
        server.wait()


def post_fresh(base: str, key: str) -> int:
    """One POST on a connection of its own: the kernel hands it to either worker."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        return client.post("/v1/requests", json=BALANCE).status_code


def answered_by(metrics: Path, route: str = "/v1/requests") -> dict[int, float]:
    """Responses on `route` each process counted (toolfence_http_responses_total, per
    pid file)."""
    counted: dict[int, float] = {}
    for path in metrics.glob("counter_*.db"):
        pid = int(path.stem.split("_")[1])
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            name, _, labels, _ = json.loads(key)
            if name == "toolfence_http_responses" and labels["route"] == route:
                counted[pid] = counted.get(pid, 0.0) + value
    return counted


def spread(base: str, key: str, metrics: Path, pids: list[int], at_least: int = 40) -> list[int]:
    """POSTs on fresh connections, 8 at a time, until every pid answered some (or 400)."""
    statuses: list[int] = []
    with ThreadPoolExecutor(8) as pool:
        while len(statuses) < 400:
            statuses += pool.map(lambda _: post_fresh(base, key), range(at_least))
            if all(answered_by(metrics).get(pid, 0) > 0 for pid in pids):
                break
    return statuses


def test_workers__two_processes__both_answer_a_revoked_key_is_refused_by_both_and_sigterm_stops_all(
    env: dict[str, str], two_workers: TwoWorkers, tmp_path: Path
) -> None:
    server, base, key, pids = two_workers
    assert len(pids) == 2
    # When requests arrive on many connections
    statuses = spread(base, key, tmp_path / "metrics", pids)
    # Then both worker processes answered some, every one accepted
    counted = answered_by(tmp_path / "metrics")
    assert all(counted.get(pid, 0) > 0 for pid in pids), (counted, pids)
    assert set(statuses) == {202}
    # When the key, now verified and cached by both, is revoked
    key_id = key.split("_")[1]
    assert toolfence(env, "keys", "revoke", key_id).returncode == 0
    before = answered_by(tmp_path / "metrics")
    with ThreadPoolExecutor(8) as pool:
        after = list(pool.map(lambda _: post_fresh(base, key), range(40)))
    # Then every next request is refused, by both workers
    assert set(after) == {401}
    counted = answered_by(tmp_path / "metrics")
    assert all(counted[pid] > before[pid] for pid in pids), (before, counted)
    # When the supervisor gets SIGTERM
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0, (tmp_path / "serve.log").read_text()
    # Then no worker is left, and nothing listens
    assert all(gone(pid) for pid in pids)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/healthz", timeout=2)


def test_workers__rate_limit__one_budget_across_processes_in_redis(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given two workers whose per-key budget is 12 a minute, counted in Redis
    limited = {**env, "TOOLFENCE_HTTP_RATE_LIMIT": "12/minute"}
    server, base = start_two_workers(limited, tmp_path / "serve.log")
    try:
        key = make_key(env)
        pids = worker_pids(server.pid)
        # When 60 requests of that key arrive over both workers
        statuses = spread(base, key, tmp_path / "metrics", pids, at_least=60)
        counted = answered_by(tmp_path / "metrics")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    # Then both answered, and 12 in all were accepted, not 12 per process
    assert all(counted.get(pid, 0) > 0 for pid in pids), (counted, pids)
    assert statuses.count(202) == 12, statuses
    assert set(statuses) == {202, 429}


def test_workers__sigkilled_worker__replaced_and_sigint_stops_all(
    two_workers: TwoWorkers, tmp_path: Path
) -> None:
    server, base, key, pids = two_workers
    # When one worker is killed outright
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = worker_pids(server.pid)
        if len(now) == 2 and pids[0] not in now:
            break
        time.sleep(0.2)
    # Then the supervisor started another in its place and still runs
    now = worker_pids(server.pid)
    assert len(now) == 2 and pids[0] not in now and pids[1] in now, (pids, now)
    assert server.poll() is None
    assert "starting another" in (tmp_path / "serve.log").read_text()
    # And the new one answers too
    statuses = spread(base, key, tmp_path / "metrics", now)
    assert set(statuses) == {202}
    assert all(answered_by(tmp_path / "metrics").get(pid, 0) > 0 for pid in now)
    # When the supervisor gets SIGINT (Ctrl-C)
    server.send_signal(signal.SIGINT)
    assert server.wait(timeout=30) == 0, (tmp_path / "serve.log").read_text()
    assert all(gone(pid) for pid in now)


def test_workers__memory_storage__refused_at_start_in_one_line(env: dict[str, str]) -> None:
    started = toolfence(
        {**env, "TOOLFENCE_HTTP_RATE_LIMIT_STORAGE": "memory://"}, "serve", "--port", str(free_port()),
        "--workers", "2",
    )
    assert started.returncode == 2, started.stderr
    [line] = started.stderr.strip().splitlines()
    assert "TOOLFENCE_HTTP_RATE_LIMIT_STORAGE=redis://" in line and "2 server processes" in line


def test_workers__help__documents_the_option() -> None:
    helped = subprocess.run(
        [sys.executable, "-m", "executor.cli.main", "serve", "--help"],
        capture_output=True, text=True, timeout=60,
    )
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())
    assert "--workers N" in text and "TOOLFENCE_HTTP_WORKERS" in text and "redis://" in text


def test_bind__one_socket_per_worker_on_one_port__accepted_connections_without_nagle() -> None:
    import asyncio
    import socket

    from executor.http.workers import bind

    sockets = bind("127.0.0.1", 0, 3)
    try:
        # Then three listening sockets share the kernel's chosen port (SO_REUSEPORT)
        ports = {sock.getsockname()[1] for sock in sockets}
        assert len(sockets) == 3 and len(ports) == 1
        assert all(sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for sock in sockets)
        # And a connection asyncio accepts on them has TCP_NODELAY set (its proto is TCP):
        # without it a response's body waited for the client's delayed ACK (40 ms)
        nodelay: list[int] = []

        async def accept_one() -> None:
            accepted = asyncio.Event()

            def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                raw = writer.get_extra_info("socket")
                nodelay.append(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                writer.close()
                accepted.set()

            # (the kernel picks which of the three sockets gets it: all three accept)
            servers = [await asyncio.start_server(connected, sock=sock) for sock in sockets]
            _, writer = await asyncio.open_connection("127.0.0.1", ports.pop())
            await asyncio.wait_for(accepted.wait(), 10)
            writer.close()
            for server in servers:
                server.close()

        asyncio.run(accept_one())
        assert nodelay == [1]
    finally:
        for sock in sockets:
            sock.close()
