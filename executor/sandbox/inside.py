"""The supervisor that runs inside the sandbox, as the first process of its PID namespace.

Not imported by toolfence: `command.py` passes this file's text to the sandbox's
interpreter (`python3 -E -s -B -c SOURCE REPORT_FD`, the flags the program runs
under), so no host path of it is ever mounted or shown. It uses the standard
library only, and nothing newer than Python 3.8, since it runs on whatever
interpreter the sandbox is given.

It makes itself non-dumpable (the program cannot trace it nor reach its
descriptors), reads the job (JSON on standard input: the program, its input
files, its limits), writes the files into the work directory, and sets the
resource limits on itself (so nothing in the sandbox runs without them, this
process included). Then it forks, and the fork runs the program as
`python -E -s -B main.py` would (one interpreter start for both; the environment
is bwrap's, built from nothing), while this process waits for it (at most its
wall-clock timeout), kills whatever the program left running (`kill(-1, SIGKILL)`
reaches every other process of the PID namespace), and describes the work
directory: each regular file's name, size and SHA-256, the text of a small UTF-8
file, and a symlink as a symlink (never followed). The report is one JSON object
on REPORT_FD, a pipe the program never holds. Being the namespace's init, it
ignores any signal the program sends it without a handler (SIGKILL included),
and its exit ends every process of the namespace.

Everything here runs with the program's own rights: a program that tampers with
it can only spoil its own report, which the host reads as untrusted, bounded data.
"""

from __future__ import annotations

import marshal
import os
import resource
import signal
import stat
import sys
from typing import Any

WORKDIR = "/work"
MAIN = "main.py"
JOB_MAX_BYTES = 4 * 1024 * 1024
COUNT_MAX = 1_000_000
CHUNK = 65536
PR_SET_DUMPABLE = 4
IN_PROGRAM: list[bool] = []  # set in the fork that runs the program


def read_job() -> Any:
    data = bytearray()
    while len(data) <= JOB_MAX_BYTES:
        chunk = os.read(0, CHUNK)
        if not chunk:
            break
        data.extend(chunk)
    # marshal: the host wrote it (runner.py), and loading it needs no import
    return marshal.loads(bytes(data))


def set_limits(limits: dict[str, Any]) -> None:
    memory = limits["memory_mb"] * 1024 * 1024
    cpu = limits["cpu_seconds"]
    for name, soft, hard in (
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_NPROC, limits["max_processes"], limits["max_processes"]),
        (resource.RLIMIT_FSIZE, limits["max_file_bytes"], limits["max_file_bytes"]),
        (resource.RLIMIT_NOFILE, limits["max_open_files"], limits["max_open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(name, (soft, hard))


def write_inputs(job: dict[str, Any]) -> dict[str, bytes]:
    written = {}
    for name, content in [[MAIN, job["code"]]] + [list(pair) for pair in job["files"]]:
        data = content.encode("utf-8")
        descriptor = os.open(os.path.join(WORKDIR, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view):]
        finally:
            os.close(descriptor)
        written[name] = data
    return written


def run_program(timeout: float, report_fd: int) -> dict[str, Any]:
    pid = os.fork()
    if pid == 0:
        IN_PROGRAM.append(True)
        run_as_main(report_fd)
        raise SystemExit(0)
    expired: list[bool] = []

    def on_alarm(signum: int, frame: Any) -> None:
        expired.append(True)
        kill_the_rest()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    while True:
        # As the namespace's first process this one inherits every orphan: reap
        # them on the way (a zombie still counts against the process limit).
        try:
            done, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        if done == pid:
            break
    signal.setitimer(signal.ITIMER_REAL, 0)
    result: dict[str, Any] = {"timed_out": bool(expired)}
    if os.WIFSIGNALED(status):
        result["signal"] = os.WTERMSIG(status)
    else:
        result["exit"] = os.WEXITSTATUS(status)
    return result


def run_as_main(report_fd: int) -> None:
    """The program, in this interpreter's fork, as `python -E -s -B main.py` runs a
    script (one interpreter start, not two): its `__main__`, its argv and path, its
    exit status, its traceback with nothing of this file in it. The fork is made
    dumpable again: it is the program's own process."""
    os.close(report_fd)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    set_dumpable(1)
    os.environ.pop("PWD", None)  # bwrap's --chdir sets it; the environment is ENVIRONMENT's alone
    path = os.path.join(WORKDIR, MAIN)
    sys.argv = [path]
    sys.path[0] = WORKDIR
    # A fresh `__main__`, as the interpreter makes for a script (runpy would do the
    # same, and import typing, re and pkgutil for it: most of a run's start-up).
    main = type(sys)("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    try:
        with open(path, "rb") as handle:
            code = compile(handle.read(), path, "exec")
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback

        frames = exc.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename != path:
            frames = frames.tb_next
        traceback.print_exception(type(exc), exc, frames)
        raise SystemExit(1) from None


def kill_the_rest() -> None:
    """Every other process of the namespace: children that outlived the program."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass


def describe(path: str, name: str, limits: dict[str, Any]) -> dict[str, Any]:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return {"name": name, "kind": "symlink", "size": 0}
    if not stat.S_ISREG(info.st_mode):
        return {"name": name, "kind": "other", "size": 0}
    import hashlib  # only when there is a file to describe: it costs an import per run

    digest = hashlib.sha256()
    head = bytearray()
    # O_NOFOLLOW: the name was a regular file a moment ago; it is never followed now.
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while True:
            chunk = os.read(descriptor, CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            if len(head) <= limits["max_text_file_bytes"]:
                head.extend(chunk[: limits["max_text_file_bytes"] + 1 - len(head)])
    finally:
        os.close(descriptor)
    entry: dict[str, Any] = {
        "name": name, "kind": "file", "size": info.st_size, "sha256": digest.hexdigest(),
    }
    if info.st_size <= limits["max_text_file_bytes"]:
        try:
            entry["text"] = bytes(head).decode("utf-8")
        except UnicodeDecodeError:
            pass
    return entry


def scan(inputs: dict[str, bytes], limits: dict[str, Any]) -> tuple[list[dict[str, Any]], int, int]:
    files: list[dict[str, Any]] = []
    count = 0
    largest = 0
    for root, directories, names in os.walk(WORKDIR):
        directories.sort()
        for name in sorted(names) + [d for d in directories if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, WORKDIR)
            count += 1
            if count > COUNT_MAX:
                return files, count, largest
            try:
                info = os.lstat(path)
            except OSError:
                continue
            largest = max(largest, info.st_size)
            if relative in inputs and unchanged(path, info, inputs[relative]):
                count -= 1  # an input the program left as it was is not an output
                continue
            if len(files) >= limits["max_files"]:
                continue
            try:
                files.append(describe(path, relative, limits))
            except OSError:
                continue
    return files, count, largest


def unchanged(path: str, info: os.stat_result, written: bytes) -> bool:
    """Is this still the regular file written as an input, byte for byte?"""
    if not stat.S_ISREG(info.st_mode) or info.st_size != len(written):
        return False
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        data = bytearray()
        while len(data) <= len(written):
            chunk = os.read(descriptor, CHUNK)
            if not chunk:
                break
            data.extend(chunk)
    finally:
        os.close(descriptor)
    return bytes(data) == written


def set_dumpable(value: int) -> None:
    """0: out of the program's reach (it runs as the same uid, and a dumpable process
    of that uid could be traced, or its descriptors opened through /proc)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def to_json(value: Any) -> str:
    """JSON for the report's few shapes, in ASCII, without importing json (and the
    regular-expression engine it loads): an import the empty program would pay."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(_escaped(character) for character in value) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(to_json(str(key)) + ":" + to_json(item) for key, item in value.items()) + "}"
    return "[" + ",".join(to_json(item) for item in value) + "]"


def _escaped(character: str) -> str:
    code = ord(character)
    if character in ('"', "\\"):
        return "\\" + character
    if 0x20 <= code < 0x7F:
        return character
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def main() -> None:
    set_dumpable(0)
    report_fd = int(sys.argv[1])
    job = read_job()
    os.write(report_fd, b"S")  # the sandbox was built: what fails from here is the run's
    limits = job["limits"]
    set_limits(limits)
    os.chdir(WORKDIR)
    inputs = write_inputs(job)
    status = run_program(limits["timeout_seconds"], report_fd)
    kill_the_rest()
    files, count, largest = scan(inputs, limits)
    usage = os.statvfs(WORKDIR)
    report = {
        "status": status,
        "files": files,
        "file_count": count,
        "largest_file": largest,
        "workdir_full": usage.f_bavail == 0,
    }
    data = to_json(report).encode("ascii")
    view = memoryview(data)
    while view:
        view = view[os.write(report_fd, view):]
    os.close(report_fd)
    # Nothing is left to clean up: the namespace ends with this process, and an
    # interpreter's finalisation would only spend the run's time.
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        if IN_PROGRAM:
            raise  # the program's own exit (SystemExit), as the interpreter ends a script
        # Never a traceback of this file where the program's stderr is read: a
        # supervisor that cannot finish leaves no report, and the run is `killed`.
        os._exit(70)
