"""`make fuzz`: run every atheris target for a set time, one after another, and
write bench/FUZZ.md (targets, executions, crashes, slowest input).

    python -m bench.fuzz.run --seconds-per-target 80 --report bench/FUZZ.md

Each target runs in its own process (bench/fuzz/harness.py) with libFuzzer's
`-max_total_time`; the enqueue targets get a private SQLite file and a private
PostgreSQL database (TOOLFENCE_FUZZ_PG_DSN, default the test server), migrated
here and dropped after. A crash stops its target (libFuzzer keeps the input in
the artifacts directory, named in the report); the others still run.
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
    slowest_seconds: float
    slowest_input: dict[str, object]
    artifact: str | None


def _private_postgres(dsn: str) -> tuple[str, str]:
    import psycopg

    name = f"toolfence_fuzz_{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = dsn.rpartition("/")
    return name, f"{base}/{name}"


def _drop_postgres(dsn: str, name: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
        [sys.executable, "-m", "bench.fuzz.harness", target, str(stats),
         f"-max_total_time={seconds}", "-rss_limit_mb=2048", "-max_len=4096", "-timeout=20",
         f"-artifact_prefix={artifacts}/", "-print_final_stats=1", str(corpus)],
        env=env, capture_output=True, text=True, errors="replace", timeout=seconds + 120,
    )
    elapsed = time.monotonic() - started
    counted = json.loads(stats.read_text()) if stats.exists() else {}
    done = re.findall(r"Done (\d+) runs", run.stderr)
    executions = max(int(counted.get("executions", 0)), int(done[-1]) if done else 0)
    crashed = run.returncode != 0
    artifact = next((str(p) for p in sorted(artifacts.iterdir())), None) if crashed else None
    if crashed:
        (workdir / f"log_{safe}.txt").write_text(run.stderr[-20_000:])
    return Outcome(
        target=target, seconds=elapsed, executions=executions, crashes=1 if crashed else 0,
        slowest_seconds=float(counted.get("slowest_seconds", 0.0)),
        slowest_input=dict(counted.get("slowest_input", {})), artifact=artifact,
    )


def write_report(path: Path, outcomes: list[Outcome], seconds: int, hypothesis_note: str) -> None:
    total = sum(o.executions for o in outcomes)
    crashes = sum(o.crashes for o in outcomes)
    lines = [
        "# Fuzzing report",
        "",
        f"Written by `make fuzz` (`python -m bench.fuzz.run`) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()}, atheris (libFuzzer, coverage-guided over `executor` "
        f"and `outbox`), {os.cpu_count()} CPU(s) shared with other work; {seconds} s per target, "
        "targets one after another.",
        "",
        "Each target calls the same function as the suite's Hypothesis tests (`tests/fuzz/targets.py`): "
        "a crash is any exception it lets through, an adapter refusal that came from the boundary's "
        "net instead of the surface's own checks, a rejection echoing the canary, or an `enqueue` "
        "that loses a call or the caller's own row.",
        "",
        f"**Total: {total:,} executions, {crashes} crashes.**",
        "",
        "| target | executions | exec/s | crashes | slowest input |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for o in outcomes:
        slow = o.slowest_input
        described = (
            f"{o.slowest_seconds * 1000:.1f} ms ({slow.get('bytes')} bytes, sha256 {slow.get('sha256')}, "
            f"starts `{slow.get('head')}`)" if slow else "-"
        )
        rate = o.executions / o.seconds if o.seconds else 0.0
        crash = f"{o.crashes} ({o.artifact})" if o.crashes else "0"
        described = described.replace("|", "/")
        lines.append(f"| `{o.target}` | {o.executions:,} | {rate:,.0f} | {crash} | {described} |")
    lines += ["", hypothesis_note, ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-target", type=int, default=80)
    parser.add_argument("--report", default="bench/FUZZ.md")
    parser.add_argument("--targets", default=",".join(TARGETS))
    args = parser.parse_args(argv)
    chosen = [t for t in args.targets.split(",") if t]
    pg_dsn = os.environ.get("TOOLFENCE_FUZZ_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="toolfence-fuzz-") as tmp:
        workdir = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
        env["PYTHONPATH"] = str(Path.cwd())
        env["TOOLFENCE_HOME"] = str(workdir / "home")
        pg_name = None
        from executor.store.migrate import migrate

        if "enqueue_sqlite" in chosen:
            sqlite_url = f"sqlite:///{workdir / 'fuzz.db'}"
            migrate(sqlite_url)
            env["TOOLFENCE_FUZZ_SQLITE_URL"] = sqlite_url
        if "enqueue_postgresql" in chosen:
            pg_name, pg_url = _private_postgres(pg_dsn)
            migrate(pg_url)
            env["TOOLFENCE_FUZZ_PG_URL"] = pg_url
        try:
            for target in chosen:
                outcome = run_target(target, args.seconds_per_target, workdir, env)
                outcomes.append(outcome)
                print(f"{target}: {outcome.executions:,} executions, {outcome.crashes} crashes", flush=True)
                if outcome.crashes:
                    kept = Path(args.report).with_name(f"fuzz-crash-{re.sub(r'[^a-z0-9]+', '_', target)}")
                    kept.mkdir(exist_ok=True)
                    for item in workdir.glob(f"*{re.sub(r'[^a-z0-9]+', '_', target)}*"):
                        if item.is_file():
                            kept.joinpath(item.name).write_bytes(item.read_bytes())
                        elif item.name.startswith("artifacts"):
                            for crash in item.iterdir():
                                kept.joinpath(crash.name).write_bytes(crash.read_bytes())
        finally:
            if pg_name is not None:
                _drop_postgres(pg_dsn, pg_name)
    note = (
        "The suite runs the same targets with Hypothesis on every `make test` (tests/fuzz, "
        "`TOOLFENCE_FUZZ_EXAMPLES` examples per target, 2,000 by default)."
    )
    write_report(Path(args.report), outcomes, args.seconds_per_target, note)
    return 1 if any(o.crashes for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
