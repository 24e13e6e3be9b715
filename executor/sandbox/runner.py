"""Run one program in the sandbox and watch it from the host.

The host starts bwrap in a process group of its own (as TOOLFENCE_SANDBOX_HOST_UID,
65534, when the worker is root: the sandbox then holds no host root even in name,
and its process limit counts), writes the job to its standard input, and reads three pipes: the
program's stdout and stderr, and the supervisor's report. It kills the whole
group, and with it the sandbox's PID namespace, when a stream passes its cap
(`output_limit`) or when the sandbox outlives its timeout plus the grace its own
teardown may take (`timeout`): the supervisor inside enforces the timeout first,
the host's deadline is the backstop for a program that stopped its supervisor.
"""

from __future__ import annotations

import json
import marshal
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.sandbox.command import Runtime, SandboxUnavailable, bwrap_argv
from executor.sandbox.limits import Limits, Program

READ_CHUNK = 65536
INFO_MAX_BYTES = 4096
PATH_MAX = 4096
STARTED = b"S"
"""The supervisor's first byte on the report pipe: the sandbox was built."""


@dataclass(frozen=True)
class Raw:
    """What the host saw of one run, before it is classified (`executor/sandbox/result.py`)."""

    stdout: bytes
    stderr: bytes
    # Which stream passed its cap ("stdout", "stderr", or "report": the description
    # of the files), if one did.
    over_output: str | None
    host_timed_out: bool
    # The supervisor's report; None when it never finished one (killed, or cut short).
    report: dict[str, Any] | None
    seconds: float


def _report_cap(limits: Limits) -> int:
    # Each file's text and name (a relative path, at most PATH_MAX) at worst six bytes
    # a byte in JSON (\u escapes), plus its other fields.
    return limits.max_files * (6 * (limits.max_text_file_bytes + PATH_MAX) + 256) + 4096


def _spawn(argv: list[str], host_uid: int, *pass_fds: int) -> subprocess.Popen[bytes]:
    extra: dict[str, Any] = {}
    if os.geteuid() == 0:
        # Never root on the host, even a mapped one: as root, RLIMIT_NPROC would
        # not bind the sandbox's processes.
        extra = {"user": host_uid, "group": host_uid, "extra_groups": []}
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=pass_fds, env={}, cwd="/", start_new_session=True, close_fds=True,
            **extra,
        )
    except OSError as exc:
        raise SandboxUnavailable(f"cannot start bubblewrap: {exc.strerror}") from None


def _kill(process: subprocess.Popen[bytes]) -> None:
    """The whole group: bwrap and the PID namespace's first process, whose death
    takes every process of the namespace with it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def execute(program: Program, limits: Limits, runtime: Runtime) -> Raw:
    """Run `program` under `limits`; SandboxUnavailable if the sandbox could not be built."""
    # marshal (format 2, which every Python 3 reads): the supervisor loads it without
    # an import. Only the host writes it; the report coming back is read as JSON.
    job = marshal.dumps(
        {"code": program.code, "files": [list(pair) for pair in program.files], "limits": limits.for_job()},
        2,
    )
    report_read, report_write = os.pipe()
    info_read, info_write = os.pipe()
    started = time.monotonic()
    try:
        process = _spawn(
            bwrap_argv(runtime, limits, report_write, info_write), runtime.host_uid, report_write, info_write
        )
    except BaseException:
        os.close(report_read)
        os.close(info_read)
        raise
    finally:
        os.close(report_write)
        os.close(info_write)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    buffers = {"stdout": bytearray(), "stderr": bytearray(), "report": bytearray(), "info": bytearray()}
    caps = {
        "stdout": limits.max_output_bytes, "stderr": limits.max_output_bytes,
        "report": _report_cap(limits), "info": INFO_MAX_BYTES,
    }
    over: str | None = None
    host_timed_out = False
    pending = memoryview(job)
    watch: int | None = None  # a pidfd on the namespace's first process
    deadline = started + limits.timeout_seconds + limits.grace_seconds
    with selectors.DefaultSelector() as selector:
        for name, fd in (
            ("stdout", process.stdout.fileno()), ("stderr", process.stderr.fileno()), ("report", report_read),
            ("info", info_read),
        ):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, name)
        stdin_fd = process.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        selector.register(stdin_fd, selectors.EVENT_WRITE, "stdin")
        try:
            while selector.get_map() and over is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    host_timed_out = True
                    break
                for key, _ in selector.select(remaining):
                    name = key.data
                    if name == "stdin":
                        try:
                            pending = pending[os.write(key.fd, pending[:READ_CHUNK]):]
                        except (BrokenPipeError, BlockingIOError) as exc:
                            if isinstance(exc, BlockingIOError):
                                continue
                            pending = pending[:0]
                        if not pending:
                            selector.unregister(key.fd)
                            process.stdin.close()
                        continue
                    data = os.read(key.fd, READ_CHUNK)
                    if not data:
                        selector.unregister(key.fd)
                        if name == "info":  # bwrap wrote it and closed it: the child is known
                            watch = _watch(bytes(buffers["info"]), process.pid)
                        continue
                    buffers[name].extend(data)
                    if len(buffers[name]) > caps[name]:
                        over = name
                        break
        except BaseException:
            # Interrupted (the worker's soft time limit, a signal): the sandbox never
            # outlives the call that started it.
            _kill(process)
            process.wait()
            if watch is not None:
                os.close(watch)
            raise
        finally:
            if over is not None or host_timed_out:
                _kill(process)
            for stream in (process.stdin, process.stdout, process.stderr):
                if not stream.closed:
                    stream.close()
            os.close(report_read)
            os.close(info_read)
    try:
        process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(process)
        process.wait()
        host_timed_out = True
    if watch is None:
        watch = _watch(bytes(buffers["info"]), process.pid)
    _await_namespace(watch, limits.grace_seconds)
    seconds = time.monotonic() - started
    report_bytes = bytes(buffers["report"])
    if not report_bytes.startswith(STARTED):
        if over is not None or host_timed_out:
            return Raw(
                bytes(buffers["stdout"]), bytes(buffers["stderr"]), over, host_timed_out, None, seconds
            )
        # bwrap's own message: not the program's (it never started), and for operators.
        message = bytes(buffers["stderr"]).decode("utf-8", "replace").strip().splitlines()
        raise SandboxUnavailable(
            "the sandbox could not be built: "
            + (message[0][:300] if message else f"bwrap exited {process.returncode}")
        )
    report = None if over is not None else _parse_report(report_bytes[len(STARTED):])
    return Raw(bytes(buffers["stdout"]), bytes(buffers["stderr"]), over, host_timed_out, report, seconds)


def _child_pid(info: bytes) -> int | None:
    """The host pid of the namespace's first process, from bwrap's `--info-fd`."""
    try:
        value = json.loads(info.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    pid = value.get("child-pid") if isinstance(value, dict) else None
    return pid if isinstance(pid, int) and pid > 1 else None


def _watch(info: bytes, bwrap_pid: int) -> int | None:
    """A pidfd on the namespace's first process, opened while bwrap (its parent) has
    not reaped it: checked to be bwrap's child, so a pid some other process took
    since is never watched, nor signalled. None when it is already gone."""
    pid = _child_pid(info)
    if pid is None:
        return None
    try:
        watch = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_bytes()
        parent = int(stat_line.rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        parent = -1
    if parent != bwrap_pid:
        os.close(watch)
        return None
    return watch


def _await_namespace(watch: int | None, seconds: float) -> None:
    """Return once the namespace's first process has exited: the kernel ends every
    other process of a PID namespace before its first one's exit completes, so the
    run leaves nothing running when this returns. Closes the pidfd."""
    if watch is None:
        return
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(watch, selectors.EVENT_READ)
            if not selector.select(seconds):
                try:
                    signal.pidfd_send_signal(watch, signal.SIGKILL)
                except OSError:
                    pass
                selector.select(seconds)
    finally:
        os.close(watch)


def _parse_report(data: bytes) -> dict[str, Any] | None:
    """The supervisor's report, or None if it is missing or malformed (the program
    can reach its supervisor, so the report is untrusted: its shape is checked
    again where it is read)."""
    if not data:
        return None
    try:
        value = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None
