"""Each network and clock nemesis of tests/chaos/netns.py, measured on real traffic.

Two nodes on the hub's bridge; a sender in one, a receiver in the other (UDP to
count loss, duplicates and reordering exactly, TCP round trips for delay). Every
claim the partitions campaign makes about a fault is checked here against what
the packets did. Root only (namespaces, nftables, tc): skipped with the reason
otherwise.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.netns import Network, Node, sweep_leftovers, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""), pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Network]:
    network = Network(tmp_path / "net").build()
    network.add_node("a")
    network.add_node("b")
    try:
        yield network
    finally:
        network.destroy()


def _start(net: Network, node: Node, *args: str) -> subprocess.Popen[str]:
    return net.run_in(node, [sys.executable, "-m", "tests.chaos.netprobe", *args], cwd=ROOT,
                      stdout=subprocess.PIPE, text=True)  # type: ignore[return-value]


def _last_json(process: subprocess.Popen[str]) -> dict:
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    return dict(json.loads(out.strip().splitlines()[-1]))


def udp(net: Network, count: int = 2000) -> dict:
    """Send `count` datagrams a → b; what b received."""
    a, b = net.nodes["a"], net.nodes["b"]
    sink = _start(net, b, "udp-sink", "7777", "1.5")
    assert sink.stdout is not None and json.loads(sink.stdout.readline())["ready"]
    _last_json(_start(net, a, "udp-send", b.address, "7777", str(count)))
    return _last_json(sink)


def rtts(net: Network, count: int = 40, size: int = 1000) -> list[float]:
    a, b = net.nodes["a"], net.nodes["b"]
    echo = _start(net, b, "tcp-echo", "7778")
    assert echo.stdout is not None and json.loads(echo.stdout.readline())["ready"]
    result = _last_json(_start(net, a, "tcp-ping", b.address, "7778", str(count), str(size)))
    _last_json(echo)
    return list(result["rtts"])


def test_clean_link__every_datagram_once_in_order(net: Network) -> None:
    # Given no fault; when a sends 2000 datagrams; then b gets each once, in order
    assert udp(net) == {"got": 2000, "distinct": 2000, "inversions": 0}


def test_loss__about_the_asked_share_dropped_then_healed(net: Network) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    # Given 30 % loss on the link
    fault = net.loss(a, b, 30)
    got = udp(net)["got"]
    # Then about 70 % arrive (2000 draws: 3 standard deviations are about 3 %)
    assert 0.62 * 2000 <= got <= 0.78 * 2000, got
    # And healed, all of them do again
    net.heal(fault)
    assert udp(net)["got"] == 2000


def test_partition__both_ways_nothing_one_way_only_that_way(net: Network) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    # Given b cut from a both ways: nothing arrives either way
    fault = net.cut([a], [b])
    assert udp(net, 300)["got"] == 0
    net.heal(fault)
    # Given a one-way cut b -> a only: a's datagrams still reach b
    net.cut([b], [a], both_ways=False)
    assert udp(net, 300)["got"] == 300
    # but a TCP connection cannot be made (the SYN-ACK never comes back)
    probe = subprocess.run([*a.prefix, sys.executable, "-c",
                            f"import socket; socket.create_connection(('{b.address}', 7), timeout=2)"],
                           capture_output=True, text=True, timeout=30, check=False)
    assert "timed out" in probe.stderr, probe.stderr
    net.heal_all()
    assert udp(net, 300)["got"] == 300


def test_duplication__about_the_asked_share_arrives_twice(net: Network) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    # Given half of a's packets to b duplicated
    net.duplicate(a, b, 50)
    seen = udp(net)
    # Then every datagram arrives, about half of them twice
    assert seen["distinct"] == 2000
    assert 1.42 * 2000 <= seen["got"] <= 1.58 * 2000, seen


def test_reordering__slow_share_overtaken(net: Network) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    # Given 30 % of a's packets to b queued behind a 400 kbit/s class
    net.slow(a, b, 30, 400)
    seen = udp(net, 1000)
    # Then nothing is lost but many arrive after a later one (packet reordering)
    assert seen["distinct"] == 1000
    assert seen["inversions"] >= 100, seen


def test_delay__every_packet_behind_a_slow_link(net: Network) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    baseline = statistics.median(rtts(net))
    # Given every packet a sends to b behind a 64 kbit/s link
    net.slow(a, b, 100, 64)
    delayed = rtts(net, count=15)
    # Then a 1000-byte round trip waits about its transmission time (125 ms) more:
    # a ratio, not a time, so a loaded machine cannot fail it
    assert statistics.median(delayed) >= 20 * baseline, (baseline, delayed)


def test_clock__skew_and_jump_read_by_the_node_sleeps_still_work(net: Network) -> None:
    a = net.nodes["a"]
    # Given a's clock 10 minutes ahead
    net.set_clock(a, 600)
    ahead = _last_json(_start(net, a, "clock"))
    offset = ahead["time"] - time.time()
    # Then its processes read it so, and time.sleep and condition waits still work
    assert 590 <= offset <= 610, offset
    assert ahead["sleeps_ok"] is True
    # And a jump back 10 minutes is seen by the next process within the cache second
    net.set_clock(a, -600)
    time.sleep(1.1)
    behind = _last_json(_start(net, a, "clock"))
    assert -610 <= behind["time"] - time.time() <= -590
    assert behind["sleeps_ok"] is True


def test_teardown__namespaces_gone_and_leftovers_of_dead_runs_swept(tmp_path: Path) -> None:
    network = Network(tmp_path / "net").build()
    node = network.add_node("x")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert node.namespace in listed and network.hub in listed
    network.destroy()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert network.prefix not in listed
    # Given a namespace left by a run whose process is gone (pid 4194303 is never live here)
    dead = "tf-4194303-1-db"
    subprocess.run(["ip", "netns", "add", dead], check=True)
    # When a new run sweeps, it removes that one and no namespace of a live run
    assert dead in sweep_leftovers()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert dead not in listed
