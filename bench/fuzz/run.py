"""`make fuzz`: run every atheris target for a set time, one after another, and
write bench/FUZZ.md (targets, executions, crashes, 5xx answers, every distinct
failure with its reproducer, slowest input).

    python -m bench.fuzz.run --seconds-per-target 80 --report bench/FUZZ.md
    python -m bench.fuzz.run --targets hosted:anthropic,http_api --seconds-per-target 180

Each target runs in its own process (bench/fuzz/harness.py) with libFuzzer's
`-max_total_time`; the SQLite target gets a private SQLite file, each PostgreSQL
target (enqueue, hosted, HTTP) a private database on TOOLFENCE_FUZZ_PG_DSN
(default the test server), migrated here and dropped after. A failing input does
not stop its target: the harness counts it and keeps the first input of each
distinct failure, copied next to the report (`fuzz-failures/<target>/`) and named
in it; replay one with `python -m bench.fuzz.harness TARGET --replay FILE`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

TARGETS = (
    "admit",
    "adapter:openai-chat",
    "adapter:openai-responses",
    "adapter:anthropic",
    "adapter:gemini",
    "adapter:gemini-interactions",
    "neutral_calls",
    "cli_input",
    "enqueue_sqlite",
    "enqueue_postgresql",
    "hosted:openai-chat",
    "hosted:openai-responses",
    "hosted:anthropic",
    "hosted:gemini",
    "hosted:gemini-interactions",
    "http_api",
    "http_console",
)
POSTGRES_TARGETS = frozenset(
    t for t in TARGETS if t == "enqueue_postgresql" or t.startswith(("hosted:", "http_"))
)

SEEDS: dict[str, list[bytes]] = {
    "adapter:openai-chat": [
        b'{"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": '
        b'[{"id": "call_1", "type": "function", "function": {"name": "get_weather", '
        b'"arguments": "{\\"city\\": \\"Oslo\\"}"}}]}}]}',
    ],
    "adapter:openai-responses": [
        b'{"status": "completed", "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1", '
        b'"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}", "status": "completed"}, '
        b'{"type": "mcp_call", "id": "mcp_1", "server_label": "crm", "name": "x", "arguments": "{}", '
        b'"output": "done"}]}',
    ],
    "adapter:anthropic": [
        b'{"role": "assistant", "stop_reason": "tool_use", "content": [{"type": "text", "text": "hi"}, '
        b'{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}, '
        b'{"type": "mcp_tool_use", "id": "m1", "name": "x", "server_name": "crm", "input": {}}]}',
    ],
    "adapter:gemini": [
        b'{"candidates": [{"finishReason": "STOP", "content": {"role": "model", "parts": '
        b'[{"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}, '
        b'{"executableCode": {"language": "PYTHON", "code": "1"}}]}}]}',
    ],
    "adapter:gemini-interactions": [
        b'{"status": "requires_action", "steps": [{"type": "function_call", "id": "c1", '
        b'"name": "get_weather", "arguments": {"city": "Oslo"}}, {"type": "google_search_call", "id": "g"}]}',
    ],
    "neutral_calls": [
        b'[{"call_id": "c1", "tool_name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}]',
        b'{"calls": [{"call_id": "c1", "tool_name": "set_alarm", "arguments": {"timezone": "UTC"}}]}',
    ],
    "cli_input": [
        b'[{"call_id": "c1", "tool_name": "get_weather", "arguments": {"city": "Oslo"}}]',
    ],
}


@dataclass
class Outcome:
    target: str
    seconds: float
    executions: int
    crashes: int
    server_errors: int
    failures: dict[str, dict[str, object]]
    slowest_seconds: float
    slowest_input: dict[str, object]
    died: str | None


def _private_postgres(dsn: str, target: str) -> tuple[str, str]:
    import psycopg

    name = f"toolfence_fuzz_{os.getpid()}_{re.sub(r'[^a-z0-9]+', '_', target)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = dsn.rpartition("/")
    return name, f"{base}/{name}"


def _drop_postgres(dsn: str, name: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _length_flags(target: str) -> list[str]:
    """The targets that build their input from choices (shapes.py) start at full
    length: libFuzzer's short first inputs would make every choice the first one."""
    return ["-len_control=0"] if target.startswith(("hosted:", "http_")) else []


def run_target(target: str, seconds: int, workdir: Path, env: dict[str, str]) -> Outcome:
    safe = re.sub(r"[^a-z0-9]+", "_", target)
    corpus = workdir / f"corpus_{safe}"
    corpus.mkdir(exist_ok=True)
    for index, seed in enumerate(SEEDS.get(target, [])):
        (corpus / f"seed{index}").write_bytes(seed)
    artifacts = workdir / f"artifacts_{safe}"
    artifacts.mkdir(exist_ok=True)
    stats = workdir / f"stats_{safe}.json"
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "bench.fuzz.harness", target, str(stats), str(artifacts),
         f"-max_total_time={seconds}", "-rss_limit_mb=2048", "-max_len=4096", "-timeout=20",
         f"-artifact_prefix={artifacts}/", "-print_final_stats=1", *_length_flags(target), str(corpus)],
        env=env, capture_output=True, text=True, errors="replace", timeout=seconds + 180,
    )
    elapsed = time.monotonic() - started
    counted = json.loads(stats.read_text()) if stats.exists() else {}
    done = re.findall(r"Done (\d+) runs", run.stderr)
    executions = max(int(counted.get("executions", 0)), int(done[-1]) if done else 0)
    died = None
    if run.returncode != 0:
        # libFuzzer ended the process itself (a timeout, out of memory, a signal): its
        # input is in the artifacts directory; the log's tail says what happened.
        (workdir / f"log_{safe}.txt").write_text(run.stderr[-20_000:])
        kept = next((p for p in sorted(artifacts.iterdir()) if not p.name.startswith("failure-")), None)
        died = f"exit {run.returncode}" + (f", input {kept.name}" if kept else "")
    failures = dict(counted.get("failures", {}))
    return Outcome(
        target=target, seconds=elapsed, executions=executions,
        crashes=int(counted.get("crashes", 0)) + (1 if died else 0),
        server_errors=int(counted.get("server_errors", 0)), failures=failures,
        slowest_seconds=float(counted.get("slowest_seconds", 0.0)),
        slowest_input=dict(counted.get("slowest_input", {})), died=died,
    )


def write_report(path: Path, outcomes: list[Outcome], seconds: int, hypothesis_note: str) -> None:
    total = sum(o.executions for o in outcomes)
    crashes = sum(o.crashes for o in outcomes)
    server_errors = sum(o.server_errors for o in outcomes)
    lines = [
        "# Fuzzing report",
        "",
        f"Written by `make fuzz` (`python -m bench.fuzz.run`) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()}, atheris (libFuzzer, coverage-guided over `executor` "
        f"and `outbox`), {os.cpu_count()} CPU(s) shared with other work; {seconds} s per target, "
        "targets one after another.",
        "",
        "Each target calls the same function as the suite's Hypothesis tests (`tests/fuzz/targets.py`, "
        "`tests/fuzz/http_targets.py`): a crash is any exception it lets through, an adapter refusal "
        "that came from the boundary's net instead of the surface's own checks, a rejection echoing "
        "the canary, an `enqueue` that loses a call or the caller's own row (the `hosted:` targets "
        "commit it on PostgreSQL around `enqueue(hosted=...)`), and, for `toolfence serve` in process "
        "over PostgreSQL (`http_api`: every route; `http_console`: the console's forms), a 5xx, an "
        "error that is not problem+json with a documented code, or an answer echoing the canary. "
        "A failing input does not stop its target; `crashes` counts failing inputs.",
        "",
        f"**Total: {total:,} executions, {crashes} crashes, {server_errors} 5xx answers.**",
        "",
        "| target | executions | exec/s | crashes | 5xx | slowest input |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for o in outcomes:
        slow = o.slowest_input
        described = (
            f"{o.slowest_seconds * 1000:.1f} ms ({slow.get('bytes')} bytes, sha256 {slow.get('sha256')}, "
            f"starts `{slow.get('head')}`)" if slow else "-"
        )
        rate = o.executions / o.seconds if o.seconds else 0.0
        died = f", {o.died}" if o.died else ""
        crash = f"{o.crashes} ({len(o.failures)} distinct{died})" if o.crashes else "0"
        described = described.replace("|", "/")
        lines.append(
            f"| `{o.target}` | {o.executions:,} | {rate:,.0f} | {crash} | {o.server_errors} | {described} |"
        )
    failing = [(o.target, key, value) for o in outcomes for key, value in o.failures.items()]
    if failing:
        lines += ["", "## Distinct failures", "",
                  "Replay one with `python -m bench.fuzz.harness TARGET --replay REPRODUCER` "
                  "(TOOLFENCE_FUZZ_PG_URL naming a migrated database for the PostgreSQL targets).", "",
                  "| target | failure | inputs | reproducer | first input |",
                  "| --- | --- | ---: | --- | --- |"]
        for target, key, value in failing:
            shown = key.replace("|", "/").replace("`", "'")
            first = str(value.get("input", "")).replace("|", "/").replace("`", "'")
            lines.append(
                f"| `{target}` | `{shown}` | {value.get('count')} | `{value.get('reproducer')}` | `{first}` |"
            )
    lines += ["", hypothesis_note, ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def _keep_failures(report: Path, outcome: Outcome, workdir: Path) -> None:
    """Copy the target's reproducers (and libFuzzer's log) next to the report, and
    point the outcome at the copies."""
    safe = re.sub(r"[^a-z0-9]+", "_", outcome.target)
    kept = report.parent / "fuzz-failures" / safe
    kept.mkdir(parents=True, exist_ok=True)
    artifacts = workdir / f"artifacts_{safe}"
    for item in [*artifacts.iterdir(), *workdir.glob(f"log_{safe}.txt")]:
        if item.is_file():
            kept.joinpath(item.name).write_bytes(item.read_bytes())
    for value in outcome.failures.values():
        value["reproducer"] = str(kept / Path(str(value["reproducer"])).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-target", type=int, default=80)
    parser.add_argument("--report", default="bench/FUZZ.md")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, of: {', '.join(TARGETS)}")
    args = parser.parse_args(argv)
    chosen = [t for t in args.targets.split(",") if t]
    unknown = [t for t in chosen if t not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    pg_dsn = os.environ.get("TOOLFENCE_FUZZ_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    report = Path(args.report)
    outcomes: list[Outcome] = []
    from executor.store.migrate import migrate

    with tempfile.TemporaryDirectory(prefix="toolfence-fuzz-") as tmp:
        workdir = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
        env["PYTHONPATH"] = str(Path.cwd())
        env["TOOLFENCE_HOME"] = str(workdir / "home")
        env["TOOLFENCE_FUZZ_WORKDIR"] = str(workdir)
        if "enqueue_sqlite" in chosen:
            sqlite_url = f"sqlite:///{workdir / 'fuzz.db'}"
            migrate(sqlite_url)
            env["TOOLFENCE_FUZZ_SQLITE_URL"] = sqlite_url
        for target in chosen:
            target_env = dict(env)
            pg_name = None
            try:
                if target in POSTGRES_TARGETS:
                    pg_name, pg_url = _private_postgres(pg_dsn, target)
                    migrate(pg_url)
                    target_env["TOOLFENCE_FUZZ_PG_URL"] = pg_url
                outcome = run_target(target, args.seconds_per_target, workdir, target_env)
            finally:
                if pg_name is not None:
                    _drop_postgres(pg_dsn, pg_name)
            if outcome.crashes:
                _keep_failures(report, outcome, workdir)
            outcomes.append(outcome)
            print(f"{target}: {outcome.executions:,} executions, {outcome.crashes} crashes "
                  f"({len(outcome.failures)} distinct), {outcome.server_errors} 5xx", flush=True)
            for key, value in outcome.failures.items():
                print(f"  {value['count']} x {key}\n    reproducer {value['reproducer']}\n"
                      f"    input {value.get('input')}", flush=True)
    note = (
        "The suite runs the same targets with Hypothesis on every `make test` (tests/fuzz, "
        "`TOOLFENCE_FUZZ_EXAMPLES` examples per target, 2,000 by default; a tenth of that for the "
        "hosted-path and HTTP targets, each example a commit or a request on PostgreSQL)."
    )
    write_report(report, outcomes, args.seconds_per_target, note)
    return 1 if any(o.crashes for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
