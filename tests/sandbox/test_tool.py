"""`sandbox.run_python` as a declared tool: its declaration, its result, the stable
codes of its limits, the operator's maxima, and its refusal when no sandbox can be
built (the program never runs unsandboxed). Against the real bubblewrap."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from executor import (
    SURFACES,
    Access,
    Approval,
    ApproverPolicy,
    ErrorCode,
    Mode,
    Registry,
    RunContext,
    ServerContext,
    ToolFailure,
    encode_tool_name,
    run_python_tool,
)
from executor.sandbox import RunPythonArgs, SandboxResult
from executor.sandbox.limits import InvalidProgram, Limits, Program
from executor.sandbox.result import Outcome, classify, shape
from executor.sandbox.runner import Raw
from tests.sandbox.hostile import names_checkout

TOOL = run_python_tool(access=Access.for_roles("member"))
CTX = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r1")


def run_context(deadline_in: float = 60.0) -> RunContext:
    return RunContext(
        operation_id="op-1", idempotency_key="toolfence:op-1", fencing_token=1,
        deadline=time.time() + deadline_in, server=CTX, attempt=1,
    )


def call(code: str, **arguments: Any) -> Any:
    return TOOL.run(RunPythonArgs(code=code, **arguments), run_context())


def test_declaration__a_read_with_untrusted_output__takeover_allowed_no_effect() -> None:
    assert TOOL.name == "sandbox.run_python"
    assert TOOL.mode is Mode.READ and TOOL.effects == frozenset() and TOOL.takeover_allowed
    assert TOOL.untrusted_output is True
    assert TOOL.approval.kind == "never"
    approved = run_python_tool(
        access=Access.for_roles("member"), approval=Approval.always(),
        approvers=ApproverPolicy.for_roles("approver"),
    )
    assert approved.approval.kind == "always"


def test_run__calculation__result_stored_as_untrusted_with_files() -> None:
    # Given a program that computes and writes a file, with an input file beside it
    code = (
        "import json\nrows = open('data.csv').read().split()\n"
        "total = sum(int(r) for r in rows)\nprint(total)\n"
        "json.dump({'total': total}, open('out.json', 'w'))\n"
    )
    result = call(code, files=[{"name": "data.csv", "content": "1\n2\n39\n"}])
    # Then the result says ok, shows the output, lists the new file and not the unchanged input
    assert isinstance(result, SandboxResult)
    assert (result.outcome, result.exit_status, result.stdout) == (Outcome.OK, 0, "42\n")
    assert [(f.name, f.kind, f.text) for f in result.files] == [("out.json", "file", '{"total": 42}')]
    assert result.files[0].sha256 == hashlib.sha256(b'{"total": 42}').hexdigest()
    # And stored as any tool's result: validated, sealed, labelled untrusted
    stored = TOOL.stored_result(result)
    assert stored["untrusted"] is True and stored["model_view"]["untrusted"] is True


def test_run__changed_input_file__listed_as_output() -> None:
    result = call("open('notes.txt', 'a').write('more')\n", files=[{"name": "notes.txt", "content": "some "}])
    assert [(f.name, f.text) for f in result.files] == [("notes.txt", "some more")]


def test_run__exception__outcome_error_with_the_programs_traceback_only() -> None:
    result = call("def f():\n    raise ValueError('bad input')\nf()\n")
    assert (result.outcome, result.exit_status) == (Outcome.ERROR, 1)
    assert result.stderr.startswith("Traceback (most recent call last):\n  File \"/work/main.py\", line 3")
    assert result.stderr.rstrip().endswith("ValueError: bad input")
    # Nothing of toolfence: no host path, no supervisor frame
    assert not names_checkout(result.stderr) and "inside.py" not in result.stderr


def test_run__secret_in_output__redacted_and_controls_dropped() -> None:
    result = call("print('api_key=sk-abcdefghijklmnopqrstuvwx', '\\x1b[2J')\n")
    assert "sk-abcdefghijklmnopqrstuvwx" not in result.stdout and "[REDACTED]" in result.stdout
    assert "\x1b" not in result.stdout


def test_run__killed_by_a_signal__outcome_killed() -> None:
    result = call("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert (result.outcome, result.exit_status, result.signal) == (Outcome.KILLED, None, "SIGSEGV")


@pytest.mark.parametrize(
    ("code", "arguments", "expected"),
    [
        ("while True:\n    pass\n", {"timeout_seconds": 1}, ErrorCode.SANDBOX_TIMEOUT),
        ("b = bytearray(8 * 1024 ** 3)\n", {"memory_mb": 128}, ErrorCode.SANDBOX_MEMORY_LIMIT),
        (
            "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1048576)\n", {},
            ErrorCode.SANDBOX_OUTPUT_LIMIT,
        ),
    ],
    ids=["timeout", "memory", "output"],
)
def test_run__limit_passed__terminal_failure_with_its_stable_code(
    code: str, arguments: dict[str, Any], expected: ErrorCode
) -> None:
    with pytest.raises(ToolFailure) as raised:
        call(code, **arguments)
    failure = raised.value
    assert (failure.code, failure.retryable) == (expected, False)
    assert "untrusted data from the program" in failure.message
    assert len(failure.message) <= 500 and not names_checkout(failure.message)


def test_run__asks_past_the_operators_maxima__held_to_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFENCE_SANDBOX_MAX_TIMEOUT_SECONDS", "1.5")
    monkeypatch.setenv("TOOLFENCE_SANDBOX_MAX_MEMORY_MB", "96")
    result = call("import resource\nprint(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)\n",
                  timeout_seconds=3000, memory_mb=4096)
    assert (result.limits.timeout_seconds, result.limits.memory_mb) == (1.5, 96)
    assert result.stdout == "96\n"


def test_run__call_deadline_near__program_timeout_held_to_it() -> None:
    args = RunPythonArgs(code="while True:\n    pass\n", timeout_seconds=10)
    with pytest.raises(ToolFailure) as raised:
        TOOL.run(args, run_context(deadline_in=Limits().grace_seconds + 1.0 + 1.0))
    assert raised.value.code is ErrorCode.SANDBOX_TIMEOUT
    # Held to what the deadline leaves (1 s, less the moments spent getting there), not 10 s
    shown = re.search(r"ran out of time \(([0-9.]+) s\)", raised.value.message)
    assert shown is not None and 0.5 < float(shown.group(1)) <= 1.0, raised.value.message


def _witness_program(tmp_path: Path) -> tuple[str, Path]:
    witness = tmp_path / "ran-unsandboxed"
    return f"open({str(witness)!r}, 'w').write('x')\n", witness


def _fake_bwrap(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "bwrap"
    script.write_text(
        f"#!/bin/sh\nif [ \"$1\" = --help ]; then echo '--size --disable-userns'; exit 0; fi\n{body}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("TOOLFENCE_SANDBOX_BWRAP", "/nonexistent/bwrap"),
        ("TOOLFENCE_SANDBOX_BWRAP", "/bin/true"),  # no --size: cannot cap a tmpfs
        ("TOOLFENCE_SANDBOX_PYTHON", "/nonexistent/python3"),
        ("TOOLFENCE_SANDBOX_PYTHON", "fake"),  # replaced below: an interpreter outside /usr
        ("TOOLFENCE_SANDBOX_BWRAP", "failing"),  # replaced below: a bwrap that cannot build it
    ],
    ids=["no-bwrap", "old-bwrap", "no-python", "python-outside-usr", "bwrap-fails"],
)
def test_run__sandbox_cannot_be_built__refused_and_never_run_unsandboxed(
    setting: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value == "fake":
        value = str(tmp_path / "python3")
        (tmp_path / "python3").write_text("#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n")
        (tmp_path / "python3").chmod(0o755)
    if value == "failing":
        value = str(_fake_bwrap(tmp_path, "echo 'bwrap: setting up uid map: Permission denied' >&2\nexit 1"))
    monkeypatch.setenv(setting, value)
    code, witness = _witness_program(tmp_path)
    with pytest.raises(ToolFailure) as raised:
        call(code)
    assert (raised.value.code, raised.value.retryable) == (ErrorCode.SANDBOX_UNAVAILABLE, False)
    assert value not in raised.value.message  # the operator's reason is logged, not shown
    assert not witness.exists()


@pytest.mark.parametrize(
    "arguments",
    [
        {"code": ""},
        {"code": "x", "files": [{"name": "../escape", "content": ""}]},
        {"code": "x", "files": [{"name": "/etc/passwd", "content": ""}]},
        {"code": "x", "files": [{"name": ".hidden", "content": ""}]},
        {"code": "x", "timeout_seconds": 0},
        {"code": "x", "memory_mb": 16},
        {"code": "x", "extra": 1},
    ],
)
def test_arguments__bad__refused_by_the_schema(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RunPythonArgs.model_validate(arguments)


def test_arguments__input_named_like_the_program__refused() -> None:
    with pytest.raises(ToolFailure) as raised:
        call("x", files=[{"name": "main.py", "content": ""}])
    assert raised.value.code is ErrorCode.INVALID_ARGUMENTS


@pytest.mark.parametrize(
    "program",
    [
        lambda: Program("x", (("a.txt", ""), ("a.txt", ""))),
        lambda: Program("x" * (64 * 1024 + 1)),
        lambda: Program("x", tuple((f"f{i}", "") for i in range(17))),
        lambda: Program("x", (("a", "y" * (256 * 1024 + 1)),)),
        lambda: Program("\udc80"),
        lambda: Limits(memory_mb=10),
        lambda: Limits(timeout_seconds=float("inf")),
    ],
)
def test_program_and_limits__out_of_bounds__invalid_program(program: Any) -> None:
    with pytest.raises(InvalidProgram):
        program()


def _raw(report: Any, *, stderr: bytes = b"", over: str | None = None, timed_out: bool = False) -> Raw:
    return Raw(b"", stderr, over, timed_out, report, 0.01)


def _report(**status: Any) -> dict[str, Any]:
    return {"status": status, "files": [], "file_count": 0, "largest_file": 0, "workdir_full": False}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (_raw(_report(exit=0)), Outcome.OK),
        (_raw(_report(exit=3)), Outcome.ERROR),
        (_raw(_report(exit=1), stderr=b"Traceback\nMemoryError\n"), Outcome.MEMORY_LIMIT),
        (_raw(_report(exit=0), stderr=b"MemoryError\n"), Outcome.OK),
        (_raw(_report(signal=24)), Outcome.TIMEOUT),  # SIGXCPU: CPU seconds
        (_raw(_report(signal=25)), Outcome.OUTPUT_LIMIT),  # SIGXFSZ
        (_raw(_report(signal=9, timed_out=True)), Outcome.TIMEOUT),
        (_raw(_report(signal=11)), Outcome.KILLED),
        (_raw(None), Outcome.KILLED),  # the supervisor never reported: the program stopped it
        (_raw({"status": "forged"}), Outcome.KILLED),
        (_raw(None, over="stderr"), Outcome.OUTPUT_LIMIT),
        (_raw(None, timed_out=True), Outcome.TIMEOUT),
        (_raw({**_report(exit=0), "file_count": 65}), Outcome.OUTPUT_LIMIT),
        (_raw({**_report(exit=1), "largest_file": 16 * 1024 * 1024}), Outcome.OUTPUT_LIMIT),
        (_raw({**_report(exit=1), "workdir_full": True}), Outcome.OUTPUT_LIMIT),
    ],
)
def test_classify__what_the_host_and_the_supervisor_saw__one_outcome(raw: Raw, expected: Outcome) -> None:
    limits = Limits()
    assert shape(raw, limits).outcome is expected
    from executor.sandbox.result import _report as parse

    assert classify(raw, parse(raw), limits) is expected


def test_shape__forged_file_entries__sanitised_and_bad_digests_dropped() -> None:
    report = _report(exit=0)
    report["files"] = [
        {
            "name": "a\x1b[31m.txt", "kind": "file", "size": -5, "sha256": "not-hex",
            "text": "token=abcdef123456",
        },
        {"name": "link", "kind": "symlink", "size": 0, "sha256": None, "text": "should not show"},
    ]
    report["file_count"] = 2
    result = shape(_raw(report), Limits())
    first, second = result.files
    assert (first.name, first.size, first.sha256) == ("a[31m.txt", 0, None)
    assert "abcdef123456" not in json.dumps(result.model_dump(mode="json"))
    assert second.text is None


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_export__each_of_the_five_surfaces__declares_the_tool_with_its_schema(surface: str) -> None:
    # (tests/unit/adapters validates the declaration against each provider's SDK types)
    exported = SURFACES[surface].export_tools(Registry([TOOL]), CTX)
    text = json.dumps(exported)
    wire_name = encode_tool_name(TOOL.name, SURFACES[surface].name_rule)
    assert len(exported) == 1 and f'"{wire_name}"' in text, text
    assert '"code"' in text and '"timeout_seconds"' in text and '"memory_mb"' in text
    assert TOOL.description in text


def test_export__a_principal_without_the_role__not_declared() -> None:
    outsider = CTX.model_copy(update={"roles": frozenset({"viewer"})})
    assert all(
        SURFACES[surface].export_tools(Registry([TOOL]), outsider) == [] for surface in SURFACES
    )


def test_run__names_and_texts_any_characters__reported_exactly_and_storable() -> None:
    # Given files whose names and texts hold what a JSON writer must escape, and a
    # name that is not UTF-8 at all
    code = (
        "open('é \"q\" \\\\ 😀.txt', 'w').write('tab\\there \"quoted\" \\\\ é 😀')\n"
        "open(b'raw\\xff'.decode('utf-8', 'surrogateescape'), 'w').write('x')\n"
    )
    result = call(code)
    # Then the report carries them exactly (the invalid byte replaced by "?"), and they store as JSON
    by_name = {f.name: f for f in result.files}
    assert by_name['é "q" \\ 😀.txt'].text == 'tab\there "quoted" \\ é 😀'
    assert set(by_name) == {'é "q" \\ 😀.txt', "raw?"}
    json.dumps(TOOL.stored_result(result), ensure_ascii=False).encode("utf-8")


def test_run__file_in_a_subdirectory_and_a_changed_program__listed_by_relative_name() -> None:
    result = call("import os\nos.makedirs('out/deep')\nopen('out/deep/r.txt', 'w').write('r')\n")
    assert [(f.name, f.text) for f in result.files] == [("out/deep/r.txt", "r")]


def test_run__interrupted_while_the_program_runs__sandbox_killed_nothing_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a program that leaves a marked process running, and a host side that is
    # interrupted (as a worker's soft time limit does) once that process is seen
    import selectors as selectors_module

    from executor.sandbox import runner
    from tests.sandbox.hostile import nothing_left, running

    uid = 61_000 + int.from_bytes(os.urandom(2), "big") % 4_000
    monkeypatch.setenv("TOOLFENCE_SANDBOX_HOST_UID", str(uid))
    marker = f"{40 + int.from_bytes(os.urandom(2), 'big') % 1000 / 1000:.3f}"
    real = selectors_module.DefaultSelector

    class Interrupting(real):  # type: ignore[misc, valid-type]
        def select(self, timeout: float | None = None) -> Any:
            if running(marker):
                raise KeyboardInterrupt
            return super().select(min(timeout or 0.05, 0.05))

    monkeypatch.setattr(runner.selectors, "DefaultSelector", Interrupting)
    code = (
        "import os, time\nif os.fork() == 0:\n"
        f"    os.execv('/bin/sleep', ['sleep', '{marker}'])\ntime.sleep(30)\n"
    )
    # When the run is interrupted
    with pytest.raises(KeyboardInterrupt):
        call(code, timeout_seconds=10)
    # Then the sandbox was killed with it: nothing of it is left running
    assert nothing_left(uid if os.geteuid() == 0 else -1, marker) == []


def test_command__every_isolation_option__on_the_command_line() -> None:
    from executor.sandbox.command import ENVIRONMENT, Runtime, bwrap_argv

    runtime = Runtime.from_settings()
    argv = bwrap_argv(runtime, Limits(), 7, 8)
    for option in (
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
        "--disable-userns",
    ):
        assert option in argv, option
    assert argv[argv.index("--uid") + 1] == argv[argv.index("--gid") + 1] == "65534"
    # Only /usr of the host is bound, read-only; every tmpfs has a size
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind", "--dev-bind")]
    assert set(binds) <= {"/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"}
    assert "--bind" not in argv and "--dev-bind" not in argv and "--share-net" not in argv
    tmpfs = [i for i, a in enumerate(argv) if a == "--tmpfs"]
    assert [argv[i + 1] for i in tmpfs] == ["/dev/shm", "/work", "/tmp"]
    assert all(argv[i - 2] == "--size" for i in tmpfs)
    assert argv.index("--remount-ro") < argv.index("/work")
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--setenv"] == [name for name, _ in ENVIRONMENT]
