"""Nodes as Linux network namespaces, and the network and clock faults between them.

One `Network` per run. Every name it makes starts with `tf-<pid>-` (the pid of
the harness, then a counter), every address is in 10.213.0.0/24, and every address exists only
inside namespaces it made:

- a hub namespace `tf-<pid>-hub` holds the bridge `br0` (no address: the hub is
  a switch, not a host) and one end of each node's veth pair;
- each node (`tf-<pid>-db`, `tf-<pid>-broker`, `tf-<pid>-worker-3`, …) holds
  the other end as `eth0` with its address, and its own loopback.

Nothing is created in the namespace the harness runs in, so no route, address
or rule of the machine changes. The harness reaches PostgreSQL and Redis
through their Unix sockets (paths in the filesystem, which namespaces do not
hide), so it stays out of every partition: it is Jepsen's control node.

Faults (each returns an id; `heal(id)` removes it, `heal_all()` removes all):

- **partitions** (`cut`): nftables rules in the hub's bridge `forward` chain drop
  the packets from one set of addresses to another — both ways, or one way
  only (asymmetric). The switch drops them silently, as a real partition does:
  the sender's kernel sees no error, TCP retransmits into the void.
- **loss** (`loss`): the same place, `numgen random mod 100 < N drop`.
- **duplication** (`duplicate`): in the sending node's `output` chain,
  `numgen random mod 100 < N dup to <peer> device eth0` (the `ip` family: the
  `inet` family has no `dup`).
- **delay with jitter, and reordering** (`slow`): this kernel has no `netem`.
  Each node's `eth0` carries an HTB qdisc with a fast class (1:10, the default)
  and a slow one (1:20, a low rate). An `output` rule moves N % of the packets
  to a peer into the slow class (`meta priority set 1:20`): at N = 100 every
  packet waits behind the slow class's queue (delay, with jitter from the
  queue's depth: a congested link); at N < 100 the slow packets are overtaken by
  the fast ones of the same flow (packet-level reordering).
- **clocks** (`set_clock`): each node's processes run under libfaketime
  (`LD_PRELOAD`), reading their offset from the node's file
  (`FAKETIME_TIMESTAMP_FILE`, re-read every second): skew and jumps of the wall
  clock, with the monotonic clock left real (`FAKETIME_DONT_FAKE_MONOTONIC=1`),
  as NTP steps a real clock. libfaketime 0.9.10 (Debian 12) then breaks
  Python 3.11's `time.sleep` (its absolute `clock_nanosleep` on the monotonic
  clock gets a negative time: EINVAL, libfaketime issue 426), so a six-line
  preload (`_SHIM`, compiled with `cc` per run) puts the kernel's
  `clock_nanosleep` back for the monotonic clock only.

Teardown: `destroy()` deletes every namespace (the veths and rules go with
them), from `try/finally`, an `atexit` hook and, at the next start, a sweep of
leftovers whose harness pid is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213.0"
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SLOW_CLASS = "1:20"
_NETWORKS = itertools.count(1)
_LEFTOVER = re.compile(r"^tf-(\d+)-")

_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 passes a negative time to an
   absolute clock_nanosleep on CLOCK_MONOTONIC (EINVAL; Python 3.11's time.sleep).
   The monotonic clock is not faked, so the kernel's call is the right one. */
int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (id == CLOCK_MONOTONIC)
        return syscall(SYS_clock_nanosleep, id, flags, req, rem) == -1 ? errno : 0;
    if (next == NULL)
        next = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))
            dlsym(RTLD_NEXT, "clock_nanosleep");
    return next(id, flags, req, rem);
}
"""


def _share(percent: int) -> str:
    """The nft match for `percent` % of the packets (none needed for all of them)."""
    if not 0 < percent <= 100:
        raise ValueError(f"a share of packets is 1-100 %, not {percent}")
    return "" if percent == 100 else f"numgen random mod 100 lt {percent} "


def compile_clock_shim(directory: Path) -> Path:
    """Build the `clock_nanosleep` preload (`_SHIM`) into `directory`; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    source, shim = directory / "clock_nanosleep_shim.c", directory / "clock_nanosleep_shim.so"
    source.write_text(_SHIM)
    _run("cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(source), "-ldl")
    return shim


def faketime_env(shim: Path, clock_file: Path) -> dict[str, str]:
    """Run a process under libfaketime: its wall clock offset by what `clock_file` says
    (`+600s`, `-90s`; re-read every second), its monotonic clock real."""
    return {
        "LD_PRELOAD": f"{shim}:{FAKETIME_LIB}",
        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_CACHE_DURATION": "1",
    }


class NetnsUnavailable(RuntimeError):
    """This machine (or user) cannot build namespaces: the reason, for a skip."""


def unavailable_reason() -> str | None:
    """Why the namespace campaign cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces, nftables and tc need root"
    missing = [name for name in ("ip", "nft", "tc", "setpriv", "cc")
               if shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if not FAKETIME_LIB.exists():
        missing.append(str(FAKETIME_LIB))
    if missing:
        return f"missing {', '.join(missing)} (scripts/ci-deps.sh installs them)"
    return None


def _run(*args: str, input_: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), input=input_, capture_output=True, text=True, timeout=30,
                            check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def sweep_leftovers() -> list[str]:
    """Delete namespaces of earlier runs whose harness process is gone; return their names."""
    listed = _run("ip", "netns", "list", check=False).stdout.split("\n")
    removed = []
    for line in listed:
        name = line.split(" ", 1)[0]
        match = _LEFTOVER.match(name)
        if not match:
            continue
        if Path(f"/proc/{match.group(1)}").exists():
            continue  # a run still going (this process or another test process)
        _run("ip", "netns", "delete", name, check=False)
        removed.append(name)
    return removed


@dataclass
class Node:
    name: str
    namespace: str
    address: str
    clock_file: Path

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


@dataclass
class Network:
    run_dir: Path
    prefix: str = field(default_factory=lambda: f"tf-{os.getpid()}-{next(_NETWORKS)}-")
    nodes: dict[str, Node] = field(default_factory=dict)
    _faults: dict[int, tuple[str, list[str]]] = field(default_factory=dict)  # id -> (where, rules)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _built: bool = False
    shim: Path | None = None

    @property
    def hub(self) -> str:
        return self.prefix + "hub"

    # ------------------------------------------------------------------ build

    def build(self) -> Network:
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        sweep_leftovers()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "clocks").mkdir(exist_ok=True)
        atexit.register(self.destroy)
        self._built = True
        _run("ip", "netns", "add", self.hub)
        self._in(self.hub, "ip", "link", "set", "lo", "up")
        self._in(self.hub, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.hub, "ip", "link", "set", "br0", "up")
        self._nft(self.hub, "table bridge tf {\n"
                  "  chain faults { }\n"
                  "  chain forward { type filter hook forward priority 0; policy accept; jump faults; }\n}\n")
        self.shim = compile_clock_shim(self.run_dir)
        return self

    def add_node(self, name: str) -> Node:
        with self._lock:
            if name in self.nodes:
                return self.nodes[name]
            index = len(self.nodes) + 2
            if index > 254:
                raise RuntimeError("more than 253 nodes in one network")
            namespace, veth = self.prefix + name, f"v{index}"
            node = Node(name, namespace, f"{SUBNET}.{index}", self.run_dir / "clocks" / f"{name}.faketime")
            node.clock_file.write_text("+0s\n")
            _run("ip", "netns", "add", namespace)
            self._in(self.hub, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                     "netns", namespace)
            self._in(self.hub, "ip", "link", "set", veth, "master", "br0", "up")
            self._in(namespace, "ip", "link", "set", "lo", "up")
            self._in(namespace, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
            self._in(namespace, "ip", "link", "set", "eth0", "up")
            # Fast class by default; the slow class's rate is set by each `slow` fault.
            self._in(namespace, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
                     "default", "10", "r2q", "100000")
            self._in(namespace, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10",
                     "htb", "rate", "10gbit")
            self._in(namespace, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid",
                     SLOW_CLASS, "htb", "rate", "1mbit", "ceil", "1mbit")
            self._nft(namespace, "table ip tf {\n  chain faults { }\n"
                      "  chain output { type filter hook output priority 0; policy accept; "
                      "jump faults; }\n}\n")
            self.nodes[name] = node
            return node

    def clock_env(self, node: Node) -> dict[str, str]:
        """The environment that runs a process under the node's clock."""
        assert self.shim is not None, "build() first"
        return faketime_env(self.shim, node.clock_file)

    def destroy(self) -> None:
        with self._lock:
            if not self._built:
                return
            for node in list(self.nodes.values()):
                _run("ip", "netns", "delete", node.namespace, check=False)
            _run("ip", "netns", "delete", self.hub, check=False)
            self.nodes.clear()
            self._faults.clear()
            self._built = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.destroy)

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def _in(namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", namespace, *args)

    def _nft(self, namespace: str, script: str) -> None:
        _run("ip", "netns", "exec", namespace, "nft", "-f", "-", input_=script)

    def _apply(self, where: str) -> None:
        """Rewrite one chain `faults` from the faults active there, in one nft transaction."""
        family = "bridge" if where == self.hub else "ip"
        rules = [rule for w, rules in self._faults.values() if w == where for rule in rules]
        script = f"flush chain {family} tf faults\n" + "".join(
            f"add rule {family} tf faults {rule}\n" for rule in rules)
        self._nft(where, script)

    def _add(self, where: str, rules: list[str]) -> int:
        with self._lock:
            fault_id = next(self._ids)
            self._faults[fault_id] = (where, rules)
            self._apply(where)
            return fault_id

    # ------------------------------------------------------------------ faults

    def cut(self, sources: Iterable[Node], targets: Iterable[Node], *, both_ways: bool = True) -> int:
        """Drop every packet from `sources` to `targets` (and back, unless one way)."""
        src, dst = list(sources), list(targets)
        rules = [f"ip saddr {a.address} ip daddr {b.address} drop" for a in src for b in dst if a != b]
        if both_ways:
            rules += [f"ip saddr {b.address} ip daddr {a.address} drop" for a in src for b in dst if a != b]
        return self._add(self.hub, rules)

    def loss(self, a: Node, b: Node, percent: int) -> int:
        """Drop `percent` % of the packets between `a` and `b`, each way."""
        return self._add(self.hub, [
            f"ip saddr {x.address} ip daddr {y.address} {_share(percent)}drop"
            for x, y in ((a, b), (b, a))
        ])

    def duplicate(self, node: Node, peer: Node, percent: int) -> int:
        """Send `percent` % of `node`'s packets to `peer` twice."""
        return self._add(node.namespace, [
            f"ip daddr {peer.address} {_share(percent)}dup to {peer.address} device eth0"
        ])

    def slow(self, node: Node, peer: Node, percent: int, rate_kbit: int) -> int:
        """Queue `percent` % of `node`'s packets to `peer` behind a `rate_kbit` link."""
        self._in(node.namespace, "tc", "class", "change", "dev", "eth0", "parent", "1:", "classid",
                 SLOW_CLASS, "htb", "rate", f"{rate_kbit}kbit", "ceil", f"{rate_kbit}kbit")
        return self._add(node.namespace, [
            f"ip daddr {peer.address} {_share(percent)}meta priority set {SLOW_CLASS}"
        ])

    def heal(self, fault_id: int) -> None:
        with self._lock:
            found = self._faults.pop(fault_id, None)
            if found is not None:
                self._apply(found[0])

    def heal_all(self) -> None:
        with self._lock:
            places = {where for where, _ in self._faults.values()}
            self._faults.clear()
            for where in places:
                self._apply(where)
            for node in self.nodes.values():
                self.set_clock(node, 0)

    def set_clock(self, node: Node, offset_seconds: float) -> None:
        """Set the node's wall clock `offset_seconds` from the real one (read within a second)."""
        temporary = node.clock_file.with_suffix(".tmp")
        temporary.write_text(f"{offset_seconds:+.0f}s\n")
        os.replace(temporary, node.clock_file)

    def run_in(self, node: Node, args: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start a process in the node's namespace (under its clock)."""
        env = {**os.environ, **self.clock_env(node)}
        return subprocess.Popen([*node.prefix, *args], env=env, **kwargs)  # type: ignore[call-overload]
