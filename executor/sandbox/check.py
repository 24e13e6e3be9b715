"""`toolfence sandbox check`: which isolation this machine provides, tried for real.

Each feature is either required (without it the tool refuses, `sandbox_unavailable`)
or reported (what the machine offers beyond, or what this version does not use).
The namespaces and limits are checked from inside a real sandbox, by a probe
program that reports what it sees.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from executor.sandbox.command import SANDBOX_ID, Runtime, SandboxUnavailable
from executor.sandbox.limits import Limits, Program
from executor.sandbox.runner import execute

PROBE = r"""
import json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
limits = open("/proc/self/limits").read()
interfaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
print(json.dumps({
    "uid": os.getuid(), "pid": os.getpid(), "hostname": os.uname().nodename,
    "no_new_privs": status.get("NoNewPrivs", "").strip(), "cap_eff": status.get("CapEff", "").strip(),
    "interfaces": interfaces, "processes": len([p for p in os.listdir("/proc") if p.isdigit()]),
    "etc": os.path.exists("/etc"), "limits": limits,
}))
"""


@dataclass(frozen=True)
class Feature:
    name: str
    available: bool
    detail: str
    required: bool = True


@dataclass(frozen=True)
class Features:
    features: tuple[Feature, ...]

    @property
    def usable(self) -> bool:
        return all(f.available for f in self.features if f.required)

    def to_json(self) -> dict[str, object]:
        return {
            "usable": self.usable,
            "features": [
                {"name": f.name, "available": f.available, "required": f.required, "detail": f.detail}
                for f in self.features
            ],
        }


def _version(bwrap: str) -> str:
    try:
        shown = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10, env={})
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    return shown.stdout.strip() or "version unknown"


def cgroup_v2() -> Feature:
    """Reported, not used: this version's limits are rlimits, the PID namespace and the
    host's timeout (decision 0221). Said plainly, with what the machine offers."""
    root = Path("/sys/fs/cgroup")
    unified = root / "cgroup.controllers"
    hybrid = root / "unified" / "cgroup.controllers"
    if unified.exists():
        controllers = unified.read_text().split()
        detail = f"cgroup v2 ({' '.join(controllers) or 'no controllers'})"
    elif hybrid.exists():
        controllers = hybrid.read_text().split()
        detail = f"hybrid: cgroup v2 at /sys/fs/cgroup/unified ({' '.join(controllers) or 'no controllers'})"
    else:
        controllers = []
        detail = "no cgroup v2"
    usable = {"memory", "pids"} <= set(controllers)
    return Feature(
        "cgroup v2 memory and pids", usable,
        f"{detail}; not used: memory is RLIMIT_AS and processes RLIMIT_NPROC per sandbox", required=False,
    )


def check_features() -> Features:
    """Every feature, tried: the runtime's settings, then a probe run in the sandbox."""
    features: list[Feature] = []
    try:
        runtime = Runtime.from_settings()
    except SandboxUnavailable as exc:
        return Features((Feature("bubblewrap and interpreter", False, str(exc)), cgroup_v2()))
    features.append(Feature("bubblewrap", True, f"{runtime.bwrap} ({_version(runtime.bwrap)})"))
    features.append(Feature("interpreter", True, f"{runtime.python} (read-only /usr)"))
    features.append(Feature("tmpfs size caps", True, "--size: /work, /tmp and /dev/shm are capped"))
    features.append(Feature(
        "no nested user namespaces", runtime.disable_userns,
        "--disable-userns" if runtime.disable_userns else "this bwrap has no --disable-userns (0.8+)",
        required=False,
    ))
    limits = Limits(timeout_seconds=10.0, memory_mb=128)
    try:
        raw = execute(Program(PROBE), limits, runtime)
        seen = json.loads(raw.stdout.decode("utf-8"))
    except SandboxUnavailable as exc:
        features.append(Feature("namespaces", False, str(exc)))
        features.append(cgroup_v2())
        return Features(tuple(features))
    except ValueError:
        features.append(
            Feature("namespaces", False, "the probe program did not report (see bwrap on this host)")
        )
        features.append(cgroup_v2())
        return Features(tuple(features))
    features += [
        Feature(
            "user namespace", seen["uid"] == SANDBOX_ID,
            f"uid {seen['uid']} inside, capabilities {seen['cap_eff']}",
        ),
        Feature(
            "PID namespace", seen["processes"] <= 2,
            f"{seen['processes']} processes visible, the program is pid {seen['pid']}",
        ),
        Feature(
            "network namespace", seen["interfaces"] == ["lo"], f"interfaces: {', '.join(seen['interfaces'])}"
        ),
        Feature("UTS namespace", seen["hostname"] == "sandbox", f"hostname {seen['hostname']!r}"),
        Feature("mount namespace", not seen["etc"], "only /usr of the host is mounted (no /etc)"),
        Feature("no_new_privs", seen["no_new_privs"] == "1", "setuid binaries do not elevate"),
        Feature(
            "rlimits", f"{limits.memory_mb * 1024 * 1024}" in seen["limits"],
            "address space, CPU seconds, processes, file size, open files, no core files",
        ),
        Feature(
            "host user", True,
            f"bwrap runs as uid {runtime.host_uid if os.geteuid() == 0 else os.geteuid()}",
            required=False,
        ),
        cgroup_v2(),
    ]
    return Features(tuple(features))
