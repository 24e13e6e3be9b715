"""Small traffic generators that prove each network nemesis does what it claims.

Run inside a node's namespace (`python -m tests.chaos.netprobe …`); each prints one
JSON line. `tests/chaos/test_netns.py` drives them.

- `udp-sink PORT IDLE`: count datagrams until none arrived for IDLE seconds; report
  how many arrived, how many distinct, and how many came after a higher sequence
  number (inversions: reordering);
- `udp-send HOST PORT COUNT`: send COUNT numbered datagrams of 200 bytes;
- `tcp-echo PORT`: echo every message back (one connection);
- `tcp-ping HOST PORT COUNT SIZE`: COUNT round trips of SIZE bytes; the round-trip
  times in seconds;
- `clock`: this process's wall clock (under the node's libfaketime), and whether
  `time.sleep` and a condition wait work.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def udp_sink(port: int, idle: float) -> dict[str, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    print(json.dumps({"ready": True}), flush=True)
    sock.settimeout(idle)
    got, inversions, highest, seen = 0, 0, -1, set()
    try:
        while True:
            data, _ = sock.recvfrom(4096)
            number = int(data.split(b" ", 1)[0])
            got += 1
            seen.add(number)
            if number < highest:
                inversions += 1
            highest = max(highest, number)
    except TimeoutError:
        pass
    return {"got": got, "distinct": len(seen), "inversions": inversions}


def udp_send(host: str, port: int, count: int) -> dict[str, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for number in range(count):
        sock.sendto(b"%d " % number + b"p" * 200, (host, port))
        time.sleep(0.0005)
    return {"sent": count}


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(left)
        if not chunk:
            raise ConnectionError("peer closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def tcp_echo(port: int) -> dict[str, int]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(1)
    print(json.dumps({"ready": True}), flush=True)
    conn, _ = server.accept()
    echoed = 0
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
            echoed += len(data)
    return {"echoed": echoed}


def tcp_ping(host: str, port: int, count: int, size: int) -> dict[str, list[float]]:
    conn = socket.create_connection((host, port), timeout=30)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    with conn:
        for _ in range(count):
            began = time.monotonic()
            conn.sendall(b"x" * size)
            _recv_exactly(conn, size)
            rtts.append(time.monotonic() - began)
    return {"rtts": rtts}


def clock() -> dict[str, float | bool]:
    began = time.monotonic()
    time.sleep(0.05)
    threading.Event().wait(0.05)
    return {"time": time.time(), "sleeps_ok": time.monotonic() - began >= 0.1}


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "udp-sink":
        out: object = udp_sink(int(args[0]), float(args[1]))
    elif command == "udp-send":
        out = udp_send(args[0], int(args[1]), int(args[2]))
    elif command == "tcp-echo":
        out = tcp_echo(int(args[0]))
    elif command == "tcp-ping":
        out = tcp_ping(args[0], int(args[1]), int(args[2]), int(args[3]))
    elif command == "clock":
        out = clock()
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
