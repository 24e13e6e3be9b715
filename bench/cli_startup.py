"""How long `toolfence --help`, `--version` and `completion bash` take to answer, in
a fresh interpreter each time, against the interpreter's own start (`python -c
pass`) and `celery --help`, measured minutes apart in one sitting. The goal is an
answer under 0.3 s (issue 34); a test checks what they import
(tests/unit/test_cli_conventions.py), this measures it, and nothing here is a
timed assertion.

    python -m bench.cli_startup [--runs 15] [--compare /path/to/another/checkout]

`--compare` adds the same rows for another checkout's `executor` (the tree before
a change, say), run by the same interpreter. Writes bench/CLI.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
REPORT = ROOT / "bench" / "CLI.md"
TOOLFENCE = [sys.executable, "-m", "executor.cli"]
ROWS: list[tuple[str, list[str]]] = [
    ("python -c pass (the interpreter's start)", [sys.executable, "-c", "pass"]),
    ("celery --help", [str(BIN / "celery"), "--help"]),
    ("toolfence --help", [*TOOLFENCE, "--help"]),
    ("toolfence --version", [*TOOLFENCE, "--version"]),
    ("toolfence completion bash", [*TOOLFENCE, "completion", "bash"]),
    ("toolfence turn start --help", [*TOOLFENCE, "turn", "start", "--help"]),
]


def timed(argv: list[str], tree: Path, runs: int) -> list[float] | None:
    """Wall seconds of `runs` fresh processes (after one unmeasured run that warms the
    file cache and the bytecode); None when the command fails there (a tree without
    `--version`)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    seconds: list[float] = []
    for index in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if done.returncode != 0:
            return None
        if index:
            seconds.append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15, help="measured runs per row (default: 15)")
    parser.add_argument("--compare", type=Path, default=None, help="another checkout to measure the same way")
    args = parser.parse_args(argv)
    trees = [("this tree", ROOT)] + ([("compared", args.compare.resolve())] if args.compare else [])
    lines = [
        "# CLI start-up",
        "",
        f"Written by `python -m bench.cli_startup --runs {args.runs}"
        + (f" --compare {args.compare}" if args.compare else "")
        + f"`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Wall time of a fresh process, "
        f"median and 90th percentile of {args.runs} runs; ratio to `python -c pass` measured in the same "
        "sitting. The goal: `--help`, `--version` and completion under 0.3 s.",
        "",
        f"Machine: {os.cpu_count()} CPUs; python {platform.python_version()}; load average "
        f"{os.getloadavg()[0]:.1f} before",
        "",
        "| command | tree | median s | p90 s | × python -c pass |",
        "|---|---|---|---|---|",
    ]
    floor = statistics.median(timed(ROWS[0][1], ROOT, args.runs) or [float("nan")])
    for label, tree in trees:
        for name, command in ROWS:
            if tree != ROOT and not name.startswith("toolfence"):
                continue
            measured = timed(command, tree, args.runs)
            if measured is None:
                lines.append(f"| {name} | {label} | fails there | | |")
                continue
            seconds = sorted(measured)
            median = statistics.median(seconds)
            p90 = seconds[min(len(seconds) - 1, int(0.9 * len(seconds)))]
            lines.append(f"| {name} | {label} | {median:.3f} | {p90:.3f} | {median / floor:.1f} |")
            print(lines[-1], flush=True)
    REPORT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"written {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
