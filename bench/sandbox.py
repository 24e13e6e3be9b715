"""What the sandbox of `sandbox.run_python` costs a run: start-up and teardown.

Alternates, `--runs` times each, a bare `python3 -c pass` (the sandbox's own
interpreter, an empty environment) and the same empty program through the tool's
runner (`executor.sandbox.runner.execute`: bwrap's namespaces and mounts, the
supervisor, the program, the report, and the wait until the namespace is gone).
The overhead is the difference of the two distributions' percentiles; runs per
second is what one worker process (a prefork child runs one call at a time) can
do back to back. Nothing here is asserted: the numbers are printed, and with
`--write` put in bench/RESULTS.md under their own heading (replacing an earlier
one).

    .venv/bin/python -m bench.sandbox [--runs 200] [--write]

On a shared machine, `nice -n -15` (as root) keeps other sessions' load from
inflating the wall-clock rows; the section says which niceness it ran at.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.sandbox.command import Runtime  # noqa: E402
from executor.sandbox.limits import Limits, Program  # noqa: E402
from executor.sandbox.runner import execute  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
HEADING = "## Sandbox start-up and teardown (sandbox.run_python, issue 29)"
TARGET_MS = 50.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def measure(runs: int) -> dict[str, float]:
    runtime = Runtime.from_settings()
    limits = Limits()
    program = Program("pass\n")
    bare: list[float] = []
    sandboxed: list[float] = []
    cpu = {"bare": 0.0, "sandbox": 0.0}
    load_before = os.getloadavg()[0]
    for _ in range(5):  # warm the page cache and the runtime's probe
        execute(program, limits, runtime)
    for _ in range(runs):
        before = cpu_ms()
        started = time.perf_counter()
        subprocess.run([runtime.python, "-c", "pass"], env={}, check=True)
        bare.append((time.perf_counter() - started) * 1000)
        middle = cpu_ms()
        started = time.perf_counter()
        raw = execute(program, limits, runtime)
        sandboxed.append((time.perf_counter() - started) * 1000)
        cpu["bare"] += middle - before
        cpu["sandbox"] += cpu_ms() - middle
        if raw.report is None or raw.report["status"].get("exit") != 0:
            raise SystemExit(f"a sandboxed run failed: {raw}")
    return {
        "runs": runs,
        "bare_p50": percentile(bare, 0.5), "bare_p99": percentile(bare, 0.99),
        "sandbox_p50": percentile(sandboxed, 0.5), "sandbox_p99": percentile(sandboxed, 0.99),
        "bare_cpu": cpu["bare"] / runs, "sandbox_cpu": cpu["sandbox"] / runs,
        "runs_per_second": 1000 / statistics.fmean(sandboxed),
        "load_before": load_before, "load_after": os.getloadavg()[0], "niceness": os.nice(0),
    }


def cpu_ms() -> float:
    """CPU time of this process and of every waited-for descendant so far (bwrap waits
    for the namespace's first process, which waits for the program): what a run
    costs the machine, whatever else is running on it."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime)


def render(figures: dict[str, float], runtime: Runtime) -> str:
    overhead_p50 = figures["sandbox_p50"] - figures["bare_p50"]
    overhead_p99 = figures["sandbox_p99"] - figures["bare_p99"]
    overhead_cpu = figures["sandbox_cpu"] - figures["bare_cpu"]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        HEADING,
        "",
        f"Written by `python -m bench.sandbox --runs {figures['runs']:.0f} --write`, {stamp}, on the",
        f"shared 2-core development machine: load average {figures['load_before']:.1f} at the start and "
        f"{figures['load_after']:.1f} at the end, niceness {figures['niceness']:.0f}"
        + (
            " (other work was running, so the wall-clock rows include waiting for a core; the CPU row "
            "is what a run costs the machine, whatever else runs)."
            if max(figures["load_before"], figures["load_after"]) >= 2 else " (a quiet machine)."
        ),
        f"{runtime.bwrap}, {runtime.python} inside;",
        "each sandboxed run is the empty program through the tool's runner, from spawning bwrap to",
        "the namespace being gone. Bare and sandboxed runs alternate.",
        "",
        "| run | wall p50 ms | wall p99 ms | CPU ms a run |",
        "|---|---|---|---|",
        f"| bare `python3 -c pass` | {figures['bare_p50']:.1f} | {figures['bare_p99']:.1f} "
        f"| {figures['bare_cpu']:.1f} |",
        f"| sandboxed `pass` (start-up, run, report, teardown) | {figures['sandbox_p50']:.1f} "
        f"| {figures['sandbox_p99']:.1f} | {figures['sandbox_cpu']:.1f} |",
        f"| **overhead of the sandbox** | **{overhead_p50:.1f}** | **{overhead_p99:.1f}** "
        f"| **{overhead_cpu:.1f}** |",
        f"| ratio sandboxed / bare | {figures['sandbox_p50'] / figures['bare_p50']:.2f} "
        f"| {figures['sandbox_p99'] / figures['bare_p99']:.2f} "
        f"| {figures['sandbox_cpu'] / figures['bare_cpu']:.2f} |",
        "",
        f"Target ≤ {TARGET_MS:.0f} ms p50 overhead: wall clock {overhead_p50:.1f} ms "
        f"({'met' if overhead_p50 <= TARGET_MS else 'not met'} at this load), CPU {overhead_cpu:.1f} ms "
        f"({'met' if overhead_cpu <= TARGET_MS else 'not met'}).",
        f"One worker process ran {figures['runs_per_second']:.1f} sandboxed runs a second back to back "
        "(a prefork child runs",
        "one call at a time; concurrency multiplies it, cores permitting). A run is one interpreter",
        "start (the supervisor's fork runs the program), bwrap's namespaces and mounts, and the",
        "description of the work directory.",
        "",
    ])


def write(section: str) -> None:
    text = RESULTS.read_text(encoding="utf-8")
    if HEADING in text:
        start = text.index(HEADING)
        following = text.find("\n## ", start + len(HEADING))
        text = text[:start] + section + (text[following + 1:] if following != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--write", action="store_true", help="put the section in bench/RESULTS.md")
    args = parser.parse_args(argv)
    runtime = Runtime.from_settings()
    section = render(measure(args.runs), runtime)
    print(section)
    if args.write:
        write(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
