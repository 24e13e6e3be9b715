"""The bubblewrap command line of one run, and the runtime it mounts.

The sandbox is fresh user, PID, network, IPC, UTS, cgroup and mount namespaces;
a read-only `/usr` (with the host's `/bin`, `/lib*`, `/sbin` links or read-only
binds, so the interpreter's loader finds its libraries) and nothing else of the
host: no `/etc`, no home, no checkout; a new `/proc` of its own PID namespace, a
minimal read-only `/dev`, and size-capped tmpfs at `/work` (the work directory),
`/tmp` and `/dev/shm`. It runs as uid/gid 65534 inside, with no capabilities,
`no_new_privs` (bwrap sets it: setuid binaries do not elevate), no further user
namespaces (`--disable-userns`, when this bwrap has it), a new session (no
terminal to inject keystrokes into), and dies with its parent.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from executor.errors import ConfigurationError
from executor.sandbox.limits import Limits
from executor.settings import read

SANDBOX_ID = 65534
"""The uid and gid inside the sandbox (and, by default, the host uid a root worker
runs bwrap as: TOOLFENCE_SANDBOX_HOST_UID)."""
RUNTIME_ROOTS = ("/usr",)
# The program's whole environment, built from nothing (no variable of the host's).
ENVIRONMENT = (
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/work"),
    ("TMPDIR", "/tmp"),
    ("LANG", "C.UTF-8"),
    ("LC_ALL", "C.UTF-8"),
)
LINKED_ROOTS = ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin")
INSIDE_SOURCE = (Path(__file__).with_name("inside.py")).read_text(encoding="utf-8")


class SandboxUnavailable(ConfigurationError):
    """This machine cannot build the sandbox; the program was not run (it never runs
    unsandboxed)."""


@dataclass(frozen=True)
class Runtime:
    """Where bubblewrap and the sandbox's interpreter are, and what this bwrap offers."""

    bwrap: str
    python: str
    disable_userns: bool = True
    # The host uid (and gid) bwrap runs as when the worker is root.
    host_uid: int = SANDBOX_ID

    @classmethod
    def from_settings(cls) -> Runtime:
        """TOOLFENCE_SANDBOX_BWRAP and TOOLFENCE_SANDBOX_PYTHON, checked: SandboxUnavailable
        (naming the setting) when either is missing or the interpreter is outside `/usr`."""
        named = str(read("TOOLFENCE_SANDBOX_BWRAP"))
        bwrap = shutil.which(named)
        if bwrap is None:
            raise SandboxUnavailable(
                f"bubblewrap not found (TOOLFENCE_SANDBOX_BWRAP={named!r}; "
                "Debian: apt-get install bubblewrap)"
            )
        python = str(read("TOOLFENCE_SANDBOX_PYTHON"))
        if not os.path.isabs(python) or not os.access(python, os.X_OK):
            raise SandboxUnavailable(
                f"TOOLFENCE_SANDBOX_PYTHON={python!r} is not an executable absolute path"
            )
        real = os.path.realpath(python)
        if not any(real == root or real.startswith(root + "/") for root in RUNTIME_ROOTS):
            raise SandboxUnavailable(
                f"TOOLFENCE_SANDBOX_PYTHON={python!r} is outside {', '.join(RUNTIME_ROOTS)}, "
                "the only runtime the sandbox mounts"
            )
        return replace(_runtime(bwrap, python), host_uid=int(read("TOOLFENCE_SANDBOX_HOST_UID")))


@functools.lru_cache(maxsize=8)
def _runtime(bwrap: str, python: str) -> Runtime:
    offered = bwrap_options(bwrap)
    if "--size" not in offered:
        # Without it a tmpfs is as large as half the host's memory.
        raise SandboxUnavailable(f"{bwrap} is too old: it cannot cap a tmpfs's size (--size, bubblewrap 0.5)")
    return Runtime(bwrap=bwrap, python=python, disable_userns="--disable-userns" in offered)


def bwrap_options(bwrap: str) -> str:
    """bwrap's `--help` text (what this version offers); "" if it would not say."""
    try:
        shown = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=10, env={}, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return shown.stdout


def runtime_mounts() -> list[str]:
    """`/usr` read-only, and the host's top-level library and binary links as they are."""
    arguments: list[str] = []
    for root in RUNTIME_ROOTS:
        arguments += ["--ro-bind", root, root]
    for root in LINKED_ROOTS:
        if os.path.islink(root):
            arguments += ["--symlink", os.readlink(root), root]
        elif os.path.isdir(root):
            arguments += ["--ro-bind", root, root]
    return arguments


def bwrap_argv(runtime: Runtime, limits: Limits, report_fd: int, info_fd: int) -> list[str]:
    """The whole command: bwrap's options, then the supervisor (`inside.py`) with the
    descriptor it reports on. The program itself comes on standard input; bwrap
    writes the host pid of the namespace's first process on `info_fd`."""
    namespaces = [
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if runtime.disable_userns:
        namespaces.append("--disable-userns")
    return [
        runtime.bwrap,
        *namespaces,
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--info-fd", str(info_fd),
        "--uid", str(SANDBOX_ID),
        "--gid", str(SANDBOX_ID),
        "--hostname", "sandbox",
        *runtime_mounts(),
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", str(limits.workdir_bytes), "--tmpfs", "/work",
        "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
        "--chdir", "/work",
        "--clearenv",
        *(argument for name, value in ENVIRONMENT for argument in ("--setenv", name, value)),
        "--",
        runtime.python, "-E", "-s", "-B", "-c", INSIDE_SOURCE, str(report_fd),
    ]
