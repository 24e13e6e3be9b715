"""`toolfence sandbox run FILE` and `toolfence sandbox check`: the sandbox of
`sandbox.run_python`, for operators and tests.

`run` runs a program under exactly the tool's sandbox and limits (a call's
defaults, `--timeout` and `--memory` held to the operator's maxima) and prints
the tool's result: exit 0 when the program's outcome is `ok`, 1 for any other
outcome or when the sandbox cannot be built (it never runs the program
unsandboxed). `check` tries each isolation feature for real: exit 0 when every
required one is there.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys

from executor.cli.args import UserError, usage_error

HELP = "Run a Python program in the sandbox of sandbox.run_python, or check this machine's isolation."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = subparsers.add_parser("sandbox", help=HELP, description=HELP)
    actions = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    parser = actions.add_parser(
        "run", help="Run a Python program in the sandbox and print its result.",
        description="Run a Python program under exactly the tool's sandbox and print the tool's result.",
    )
    parser.set_defaults(func=run_run)
    parser.add_argument("file", metavar="FILE", help="the program (UTF-8 Python; - for standard input)")
    parser.add_argument("--json", action="store_true", help="the result as the tool's JSON")
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="S",
        help="wall-clock seconds (default 5; at most TOOLFENCE_SANDBOX_MAX_TIMEOUT_SECONDS)",
    )
    parser.add_argument(
        "--memory", type=int, default=None, metavar="MB",
        help="address space in MiB (default 256, at least 64; at most TOOLFENCE_SANDBOX_MAX_MEMORY_MB)",
    )
    parser = actions.add_parser(
        "check", help="Report which isolation features this machine provides.",
        description="Try each isolation feature of the sandbox on this machine and report it.",
    )
    parser.set_defaults(func=run_check)
    parser.add_argument("--json", action="store_true", help="as JSON")


def _read_program(path: str) -> str:
    from executor.sandbox.limits import MAX_CODE_BYTES

    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_CODE_BYTES + 1)
        else:
            descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                    raise usage_error(f"{path} is not a regular file (for standard input, give -)")
                os.set_blocking(descriptor, True)
                with os.fdopen(descriptor, "rb", closefd=False) as handle:
                    data = handle.read(MAX_CODE_BYTES + 1)
            finally:
                os.close(descriptor)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_CODE_BYTES:
        raise usage_error(f"{path} is over {MAX_CODE_BYTES} bytes, the most a program may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise usage_error(f"{path} is not UTF-8 text") from None


def run_run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from executor.core.tools import ToolFailure
    from executor.sandbox import SandboxUnavailable
    from executor.sandbox.result import Outcome
    from executor.sandbox.tool import RunPythonArgs, run_sandboxed

    code = _read_program(args.file)
    try:
        call = RunPythonArgs(code=code or "\n", timeout_seconds=args.timeout, memory_mb=args.memory)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = {"timeout_seconds": "--timeout", "memory_mb": "--memory"}.get(str(problem["loc"][0]), "FILE")
        raise usage_error(f"{where}: {problem['msg']}") from None
    try:
        result = run_sandboxed(call)
    except SandboxUnavailable as exc:
        raise UserError(f"sandbox unavailable: {exc} (see `toolfence sandbox check`)") from None
    except ToolFailure as exc:
        raise usage_error(exc.message) from None
    if args.json:
        from executor.cli.common import print_json

        print_json(result.model_dump(mode="json"))
    else:
        _print_result(result)
    return 0 if result.outcome is Outcome.OK else 1


def _print_result(result: object) -> None:
    from executor.sandbox.result import SandboxResult

    assert isinstance(result, SandboxResult)
    ended = f"exit {result.exit_status}" if result.signal is None else result.signal
    print(f"outcome: {result.outcome.value} ({ended}) in {result.duration_ms} ms")
    for name, text, cut in (
        ("stdout", result.stdout, result.stdout_truncated),
        ("stderr", result.stderr, result.stderr_truncated),
    ):
        if text or cut:
            print(f"--- {name}{' (truncated)' if cut else ''} (untrusted)")
            shown = text.encode("ascii", "backslashreplace").decode("ascii")
            print(shown, end="" if shown.endswith("\n") else "\n")
    for file in result.files:
        digest = f" sha256 {file.sha256}" if file.sha256 else ""
        print(f"file {file.name!a}: {file.kind}, {file.size} bytes{digest}")
    if result.files_truncated:
        print("(more files than a result describes)")


def run_check(args: argparse.Namespace) -> int:
    from executor.sandbox.check import check_features

    features = check_features()
    if args.json:
        from executor.cli.common import print_json

        print_json(features.to_json())
    else:
        for feature in features.features:
            mark = "ok  " if feature.available else ("MISSING" if feature.required else "no  ")
            print(f"{mark:8}{feature.name}: {feature.detail}")
        print("usable" if features.usable else "NOT usable: sandbox.run_python refuses (sandbox_unavailable)")
    return 0 if features.usable else 1
