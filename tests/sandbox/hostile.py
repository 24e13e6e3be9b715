"""Hostile programs: what model-written code might try, and what the sandbox must answer.

Shared by tests/sandbox (the runner and the CLI) and tests/fleet/test_fleet_sandbox.py
(a real worker's prefork child). Each program prints `blocked …` for every attempt
the sandbox refused and `LEAK …` for any that got through; a test checks the
outcome, the lines it expects, that no `LEAK` and no host secret appears anywhere
in what the model is shown, and that nothing of the run is left running.

Placeholders (`@NAME@`) are filled per test by `Host.render`: the path and secret
of a canary file on the host, the checkout, a host pid, the marker of a process
the program leaves behind.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
# The checkout's path as a whole name: a checkout at /work/main must not match the
# jail's own /work/main.py, which is the program's file and not a host path.
_CHECKOUT_NAMED = re.compile(re.escape(str(CHECKOUT)) + r"(?![\w.-])")


def names_checkout(text: str) -> bool:
    """Does `text` name the host's checkout (or a path under it)?"""
    return _CHECKOUT_NAMED.search(text) is not None
CANARY_ENV = "TOOLFENCE_SANDBOX_TEST_CANARY"
# Generous: a bound on the supervisor's and the host's teardown on a loaded machine,
# not a speed claim (bench/ measures speed).
MARGIN_SECONDS = 5.0 + 5.0


@dataclass(frozen=True)
class Host:
    """What a test puts on the host for the programs to try to reach."""

    canary_path: str
    canary_secret: str
    env_secret: str
    host_pid: int
    marker: str

    @classmethod
    def create(cls, directory: Path) -> Host:
        secret = f"canary-file-{uuid.uuid4().hex}"
        path = directory / "host-canary.txt"
        path.write_text(secret, encoding="utf-8")
        path.chmod(0o644)
        return cls(
            canary_path=str(path), canary_secret=secret, env_secret=f"canary-env-{uuid.uuid4().hex}",
            host_pid=os.getpid(), marker=f"{30 + int(uuid.uuid4().int % 1000) / 1000:.3f}",
        )

    def render(self, code: str) -> str:
        for name, value in (
            ("CANARY_PATH", self.canary_path), ("CHECKOUT", str(CHECKOUT)),
            ("HOST_PID", str(self.host_pid)), ("MARKER", self.marker),
        ):
            code = code.replace(f"@{name}@", value)
        return code

    @property
    def secrets(self) -> tuple[str, ...]:
        """What must never appear in a result: the canaries, the checkout's path."""
        return (self.canary_secret, self.env_secret, str(CHECKOUT), "LEAK")


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    outcome: str
    # Lines (or their first words) the program's stdout must hold, where it is shown.
    expect: tuple[str, ...] = ()
    timeout: float = 2.0
    memory_mb: int = 128
    # Output file names and kinds the result must list.
    files: dict[str, str] = field(default_factory=dict)


TRY = """
def attempt(label, action):
    try:
        action()
    except OSError as exc:
        print("blocked", label, type(exc).__name__)
    else:
        print("LEAK", label)
"""

HOSTILE: tuple[Hostile, ...] = (
    Hostile(
        "tcp_to_local_postgresql",
        TRY + 'import socket\nattempt("postgres", lambda: socket.create_connection(("127.0.0.1", 5432), 1))',
        "ok", expect=("blocked postgres",),
    ),
    Hostile(
        "tcp_to_outside",
        TRY + 'import socket\nattempt("outside", lambda: socket.create_connection(("1.1.1.1", 443), 1))',
        "ok", expect=("blocked outside",),
    ),
    Hostile(
        "resolve_a_name",
        TRY + 'import socket\nattempt("dns", lambda: socket.getaddrinfo("example.com", 443))',
        "ok", expect=("blocked dns",),
    ),
    Hostile(
        "read_host_canary_file",
        TRY + 'attempt("canary", lambda: print(open("@CANARY_PATH@").read()))',
        "ok", expect=("blocked canary",),
    ),
    Hostile(
        "read_the_checkout",
        TRY + 'import os\nattempt("readme", lambda: print(open("@CHECKOUT@/README.md").read()))\n'
        'attempt("listing", lambda: print(os.listdir("@CHECKOUT@")))\n'
        'print("host dirs", [d for d in ("etc", "home", "root", "var", "opt", "srv", "mnt", "run") '
        'if os.path.exists("/" + d)])',
        "ok", expect=("blocked readme", "blocked listing", "host dirs []"),
    ),
    Hostile(
        "read_etc_shadow",
        TRY + 'attempt("shadow", lambda: print(open("/etc/shadow").read()))\n'
        'attempt("passwd", lambda: print(open("/etc/passwd").read()))',
        "ok", expect=("blocked shadow", "blocked passwd"),
    ),
    Hostile(
        "read_proc_1_environ",
        TRY + 'attempt("init-environ", lambda: print(open("/proc/1/environ", "rb").read()))',
        "ok", expect=("blocked init-environ",),
    ),
    Hostile(
        "read_another_process",
        TRY + 'import os\nattempt("host-pid", lambda: print(open("/proc/@HOST_PID@/environ", "rb").read()))\n'
        'print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))',
        "ok", expect=("blocked host-pid", "pids [1, 2]"),
    ),
    Hostile(
        "print_the_environment",
        'import os\nprint("env", sorted(os.environ))\nprint(dict(os.environ))',
        "ok", expect=("env ['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']",),
    ),
    Hostile(
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "timeout", timeout=1.5,
    ),
    Hostile("allocate_8_gib", "buffer = bytearray(8 * 1024 ** 3)\nprint(len(buffer))", "memory_limit"),
    Hostile("spin_forever", "while True:\n    pass", "timeout", timeout=1.0),
    Hostile(
        "child_sleeps_after_parent_exits",
        'import os\nif os.fork() == 0:\n    os.execv("/bin/sleep", ["sleep", "@MARKER@"])\n'
        'print("parent done")',
        "ok", expect=("parent done",),
    ),
    Hostile(
        "write_50_mb_to_stdout",
        'import sys\nfor _ in range(50):\n    sys.stdout.write("x" * 1024 * 1024)',
        "output_limit",
    ),
    Hostile(
        "write_a_1_gib_file",
        'with open("big.bin", "wb") as f:\n    for _ in range(1024):\n        f.write(b"x" * 1024 * 1024)',
        "output_limit",
    ),
    Hostile(
        "create_100000_files",
        'for i in range(100_000):\n    open(f"f{i}", "w").close()\nprint("made")',
        "output_limit", timeout=10.0,
    ),
    Hostile(
        "symlink_to_a_host_file_as_output",
        'import os\nos.symlink("/etc/shadow", "shadow")\nos.symlink("@CANARY_PATH@", "canary")\n'
        'open("real.txt", "w").write("inside")\nprint("linked")',
        "ok", expect=("linked",), files={"shadow": "symlink", "canary": "symlink", "real.txt": "file"},
    ),
    Hostile(
        "ptrace",
        TRY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def trace(pid):\n"
        "    if libc.ptrace(16, pid, 0, 0) != 0:\n"
        "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
        'attempt("ptrace-supervisor", lambda: trace(1))\nattempt("ptrace-host", lambda: trace(@HOST_PID@))',
        "ok", expect=("blocked ptrace-supervisor", "blocked ptrace-host"),
    ),
    Hostile(
        "mount_and_unshare",
        TRY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def check(result):\n"
        "    if result != 0:\n"
        "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
        'os.mkdir("m")\n'
        'attempt("mount", lambda: check(libc.mount(b"none", b"/work/m", b"tmpfs", 0, None)))\n'
        'attempt("unshare-user", lambda: check(libc.unshare(0x10000000)))\n'
        'attempt("unshare-mount", lambda: check(libc.unshare(0x00020000)))\n'
        'attempt("unshare-net", lambda: check(libc.unshare(0x40000000)))',
        "ok",
        expect=("blocked mount", "blocked unshare-user", "blocked unshare-mount", "blocked unshare-net"),
    ),
    Hostile(
        "setuid_binary",
        TRY + "import os, stat, subprocess\n"
        'binary = "/usr/bin/mount"\n'
        'print("setuid", bool(os.stat(binary).st_mode & stat.S_ISUID))\n'
        'os.mkdir("m")\n'
        'subprocess.run([binary, "-t", "tmpfs", "none", "/work/m"], capture_output=True)\n'
        "def mounted():\n"
        '    if " /work/m " in open("/proc/self/mountinfo").read():\n'
        "        return\n"
        '    raise OSError("not mounted")\n'
        'attempt("setuid-mount", mounted)\n'
        'print("no_new_privs", open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0])',
        "ok", expect=("setuid True", "blocked setuid-mount", "no_new_privs 1"),
    ),
    Hostile(
        "write_to_dev",
        TRY + 'attempt("dev-new-file", lambda: open("/dev/evil", "w").write("x"))\n'
        'attempt("dev-disk", lambda: open("/dev/vda", "wb").write(b"x"))\n'
        'import os, stat\n'
        'attempt("mknod-disk", lambda: os.mknod("/work/vda", stat.S_IFBLK | 0o600, os.makedev(254, 0)))',
        "ok", expect=("blocked dev-new-file", "blocked dev-disk", "blocked mknod-disk"),
    ),
)


def processes_of(uid: int) -> list[int]:
    """Host pids whose real uid is `uid` (the sandbox's, when bwrap ran as it)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                found.append(int(entry))
    return found


def running(marker: str) -> list[int]:
    """Host pids whose command line has the marker as one of its arguments."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline.split(b"\0"):
                found.append(int(entry))
    return found


def nothing_left(uid: int, marker: str, wait_seconds: float = 5.0) -> list[str]:
    """What of a run is still running (empty when nothing): processes of its host uid,
    and any process whose command line holds the marker. Waits a bounded while for
    the kernel to finish reaping."""
    deadline = time.monotonic() + wait_seconds
    while True:
        left = [f"pid {pid} (uid {uid})" for pid in processes_of(uid)]
        left += [f"pid {pid} runs the marker" for pid in running(marker)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
