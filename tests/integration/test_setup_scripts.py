"""What `make test` runs before pytest: scripts/services.sh starts a server that is
down and says in one line what to do when it cannot; scripts/ci-deps.sh says in
one line which packages to install when it is not root.

Real processes: a private redis-server on a free port in a temporary directory
(shut down in teardown, whatever happens), never the shared servers. The
not-root cases run the scripts as `nobody` through setpriv when the suite runs
as root, and as the current user otherwise; the scripts are copied to a
world-readable directory first so that `nobody` can read them from any clone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.netkit import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "scripts" / "services.sh"
DEPS = ROOT / "scripts" / "ci-deps.sh"
INTERPRETERS = {"services.sh": "bash", "ci-deps.sh": "sh"}
NOBODY = 65534
# Directories the scripts may not write as anyone but root: nothing can be created under /.
UNWRITABLE_DIR = "/toolfence-setup-test-unwritable"


def redis_cli(port: int, *args: str) -> str:
    result = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True, text=True, timeout=10,
    )
    return result.stdout.strip()


def answers_ping(port: int) -> bool:
    return redis_cli(port, "ping") == "PONG"


def redis_pid(port: int) -> int | None:
    for line in redis_cli(port, "info", "server").splitlines():
        if line.startswith("process_id:"):
            return int(line.split(":", 1)[1])
    return None


def stop_redis(port: int) -> None:
    """Shut down whatever Redis answers on `port`; SIGKILL it if it will not go."""
    pid = redis_pid(port)
    redis_cli(port, "shutdown", "nosave")
    deadline = time.monotonic() + 10
    while answers_ping(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid is not None and answers_ping(port):
        os.kill(pid, signal.SIGKILL)


def run_script(script: Path, *args: str, env: dict[str, str] | None = None,
               unprivileged: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    interpreter = INTERPRETERS[script.name]  # as the Makefile runs them
    argv = [shutil.which(interpreter) or interpreter, str(script), *args]
    if unprivileged and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("setpriv is required to run the scripts as nobody: "
                        "run scripts/ci-deps.sh (util-linux)")
        argv = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    return subprocess.run(
        argv, env={**os.environ, **(env or {})}, cwd=cwd or ROOT,
        capture_output=True, text=True, timeout=120,
    )


@pytest.fixture(scope="module", autouse=True)
def redis_binaries() -> None:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server and redis-cli are required: "
                    "run scripts/ci-deps.sh (redis-server, redis-tools)")


@pytest.fixture
def readable_copy() -> Iterator[Path]:
    """A 0755 directory holding copies of both scripts, readable by nobody."""
    directory = Path(tempfile.mkdtemp(prefix="toolfence-setup-"))
    try:
        directory.chmod(0o755)
        for script in (SERVICES, DEPS):
            copy = directory / script.name
            shutil.copyfile(script, copy)
            copy.chmod(0o755)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class PrivateRedis:
    port: int
    directory: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "TOOLFENCE_REDIS_PORT": str(self.port),
            "TOOLFENCE_REDIS_DIR": str(self.directory),
            "TOOLFENCE_REDIS_LOG": str(self.directory / "redis.log"),
            "TOOLFENCE_SERVICES_TIMEOUT": "20",
        }


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A spare port and directory for a Redis nobody runs yet; stopped in teardown."""
    server = PrivateRedis(free_port(), tmp_path / "redis")
    try:
        yield server
    finally:
        stop_redis(server.port)


# ------------------------------------------------------------------ services.sh


def test_services__redis_down__started_and_answers_ping(private_redis: PrivateRedis) -> None:
    # Given no Redis on a spare port
    assert not answers_ping(private_redis.port)
    # When the service script is asked for Redis there
    result = run_script(SERVICES, "redis", env=private_redis.env)
    # Then it started one, waited for it, and it answers, unpersisted, in the given directory
    assert result.returncode == 0, result.stderr
    assert f"Redis is up on 127.0.0.1:{private_redis.port}" in result.stdout
    assert result.stderr == ""
    assert answers_ping(private_redis.port)
    directory = redis_cli(private_redis.port, "config", "get", "dir").splitlines()[1]
    assert directory == str(private_redis.directory)
    assert redis_cli(private_redis.port, "config", "get", "appendonly").splitlines()[1] == "no"
    assert redis_cli(private_redis.port, "config", "get", "save").splitlines()[1:] in ([], [""])
    assert (private_redis.directory / "redis.log").exists()


def test_services__redis_already_up__left_alone(private_redis: PrivateRedis) -> None:
    # Given a Redis already answering on the port
    private_redis.directory.mkdir(parents=True)
    subprocess.run(
        ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", str(private_redis.port),
         "--save", "", "--appendonly", "no", "--dir", str(private_redis.directory),
         "--logfile", str(private_redis.directory / "own.log")],
        check=True, timeout=10,
    )
    deadline = time.monotonic() + 10
    while not answers_ping(private_redis.port):
        assert time.monotonic() < deadline, "the test's own Redis did not come up"
        time.sleep(0.1)
    before = redis_pid(private_redis.port)
    # When the service script is asked for Redis there
    result = run_script(SERVICES, "redis", env=private_redis.env)
    # Then it reports it up and starts nothing
    assert result.returncode == 0, result.stderr
    assert "starting" not in result.stdout
    assert redis_pid(private_redis.port) == before
    assert not (private_redis.directory / "redis.log").exists()


def test_services__port_held_by_a_non_redis_listener__one_error_line_within_the_timeout(
    private_redis: PrivateRedis,
) -> None:
    # Given something that accepts connections on the port but never answers PING
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", private_redis.port))
        listener.listen()
        # When the service script is asked for Redis there, with a 2 s timeout
        started = time.monotonic()
        result = run_script(SERVICES, "redis", env={**private_redis.env, "TOOLFENCE_SERVICES_TIMEOUT": "2"})
        elapsed = time.monotonic() - started
    # Then it gives up, bounded, with one line naming the port and the log to read
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"Redis did not come up on 127.0.0.1:{private_redis.port} within 2 s" in lines[0]
    assert str(private_redis.directory / "redis.log") in lines[0]
    assert elapsed < 30


def test_services__not_root_and_redis_down__one_line_says_to_start_it(readable_copy: Path) -> None:
    port = free_port()
    # Given no Redis on a spare port, and a caller who is not root and may not write Redis's directory
    env = {"TOOLFENCE_REDIS_PORT": str(port), "TOOLFENCE_REDIS_DIR": UNWRITABLE_DIR,
           "TOOLFENCE_REDIS_LOG": f"{UNWRITABLE_DIR}/redis.log"}
    # When the service script is asked for Redis
    result = run_script(readable_copy / "services.sh", "redis", env=env, unprivileged=True, cwd=readable_copy)
    # Then it fails with exactly one line saying what to start, and starts nothing
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"Redis is not running on 127.0.0.1:{port}: start it" in lines[0]
    assert result.stdout == ""
    assert not answers_ping(port)


def test_services__unknown_service__one_line_and_nothing_checked(readable_copy: Path) -> None:
    result = run_script(readable_copy / "services.sh", "redis", "mysql", cwd=readable_copy)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "services: unknown service 'mysql' (known: postgres redis rabbitmq)"
    ]
    assert result.stdout == ""


# ------------------------------------------------------------------ ci-deps.sh


def path_without(tmp: Path, *hidden: str) -> str:
    """A PATH with every program of /usr/bin and /bin except `hidden` (symlinks)."""
    fake = tmp / "bin"
    fake.mkdir()
    fake.chmod(0o755)
    for directory in (Path("/usr/bin"), Path("/bin")):
        for entry in directory.iterdir():
            if entry.name in hidden or (fake / entry.name).exists():
                continue
            try:
                if entry.is_file() and entry.stat().st_mode & stat.S_IXOTH:
                    (fake / entry.name).symlink_to(entry)
            except OSError:
                continue
    return str(fake)


def test_deps__not_root_and_promtool_missing__one_line_names_the_package(readable_copy: Path) -> None:
    # Given a PATH without promtool and prometheus (the script also looks in /usr/sbin and /sbin)
    assert shutil.which("promtool", path="/usr/sbin:/sbin") is None
    assert shutil.which("prometheus", path="/usr/sbin:/sbin") is None
    path = path_without(readable_copy, "promtool", "prometheus")
    # When the deps script runs as a user who is not root
    result = run_script(
        readable_copy / "ci-deps.sh", env={"PATH": path}, unprivileged=True, cwd=readable_copy
    )
    # Then it installs nothing and fails with exactly one line naming what is missing and the package
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "missing" in lines[0] and "promtool, prometheus" in lines[0]
    assert "apt-get install" in lines[0] and " prometheus" in lines[0].split("apt-get install", 1)[1]
    assert result.stdout == ""


def test_deps__not_root_and_alertmanager_missing__one_line_names_the_package(
    readable_copy: Path,
) -> None:
    # Given a PATH without Debian's alertmanager (tests/integration/test_ops_alertmanager.py)
    assert shutil.which("prometheus-alertmanager", path="/usr/sbin:/sbin") is None
    path = path_without(readable_copy, "prometheus-alertmanager", "amtool")
    # When the deps script runs as a user who is not root
    result = run_script(
        readable_copy / "ci-deps.sh", env={"PATH": path}, unprivileged=True, cwd=readable_copy
    )
    # Then it names both commands and the one package that provides them
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "missing prometheus-alertmanager, amtool;" in lines[0]
    assert lines[0].split("apt-get install", 1)[1].split()[0] == "prometheus-alertmanager"
    assert result.stdout == ""


def test_deps__not_root_and_everything_installed__silent_success(readable_copy: Path) -> None:
    # Given the packages `make test` installed; when the deps script runs as a user who is not root
    result = run_script(readable_copy / "ci-deps.sh", unprivileged=True, cwd=readable_copy)
    # Then it has nothing to say and nothing to do
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
