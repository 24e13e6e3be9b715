"""Drivers: the model as a pure function, `call(request) -> response`.

A driver gets one `ModelRequest` (purpose, the assembled prompt, the exported
tools) and returns one `ModelResponse` (text, or a provider response in native
mode) with a usage record. Drivers never execute anything: a proposal is only
a proposal until admission and a worker decide. A driver spec names one
(`scripted:PATH`, `cli:COMMAND`, `openai-chat:MODEL`, `openai-responses:MODEL`,
`anthropic:MODEL`, `gemini:MODEL`); the SDK drivers live in
`executor.turns.sdk` and import their SDK only when built, and
`executor.turns.specs` turns a spec into its driver. A CLI agent
(`cli:COMMAND`) gets the prompt on stdin and an allowlisted environment.

The scripted driver replays model outputs from a JSONL file, one line per model
call: line *n* answers the turn's *n*-th call of its purpose (`call_index`), so
a resumed turn asking a step again would get the same line, and the persisted
call log beside the file (`PATH.calls`, one JSON line per call, appended with a
single `O_APPEND` write) lets a test prove no step was asked twice. A line that
is a JSON string is the model's raw text (prose, a truncated object); any other
JSON value is the text of that value (the JSON contract), or, for a native
surface (`scripted+SURFACE:PATH`), the provider response itself.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from executor.errors import TurnError
from executor.turns.values import JSON_MODE, ModelRequest, ModelResponse, Usage


class DriverError(TurnError):
    """The driver could not answer (network, provider error, no scripted line).
    `retryable`: worth another attempt; `code` is stable for the turn's record."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class Driver(Protocol):
    @property
    def mode(self) -> str:
        """`json` (the JSON contract) or the provider surface of native tool calls."""
        ...

    def call(self, request: ModelRequest) -> ModelResponse: ...


@dataclass(frozen=True)
class ScriptedDriver:
    """Replays `path`, one JSONL line per model call of a purpose (by `call_index`)."""

    path: Path
    mode: str = JSON_MODE
    model: str = "scripted"

    @property
    def calls_path(self) -> Path:
        return self.path.with_name(self.path.name + ".calls")

    def _line(self, index: int) -> Any:
        try:
            lines = [line for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise DriverError("script_unreadable", f"cannot read the script: {exc.strerror}") from None
        if not 1 <= index <= len(lines):
            raise DriverError("script_exhausted", f"the script has no line {index}")
        try:
            return json.loads(lines[index - 1])
        except ValueError:
            raise DriverError("script_invalid", f"line {index} of the script is not JSON") from None

    def _log_call(self, request: ModelRequest) -> None:
        line = json.dumps({
            "turn_id": request.turn_id, "purpose": request.purpose, "call_index": request.call_index,
            "pid": os.getpid(), "at": time.time(),
        }) + "\n"
        descriptor = os.open(self.calls_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)

    def call(self, request: ModelRequest) -> ModelResponse:
        started = time.perf_counter()
        self._log_call(request)
        value = self._line(request.call_index)
        text = value if isinstance(value, str) else json.dumps(value)
        # A script has no tokenizer: about four characters a token, like most models.
        usage = Usage(
            model=self.model, purpose=request.purpose,
            input_tokens=len(request.prompt) // 4, output_tokens=len(text) // 4,
            cost_usd=0.0, latency_seconds=time.perf_counter() - started,
        )
        if self.mode != JSON_MODE and isinstance(value, dict):
            return ModelResponse(usage=usage, raw=value)
        return ModelResponse(usage=usage, text=text)


# What a CLI agent's process may see of this one's environment: these, and the names
# listed in TOOLFENCE_TURN_CLI_ENV_ALLOW. An allowlist, never a denylist: a secret
# added to the worker's environment later does not leak by default.
CLI_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
CLI_TIMEOUT_SECONDS = 120.0
CLI_MAX_OUTPUT_BYTES = 1_000_000


@dataclass(frozen=True)
class CliAgentDriver:
    """A command-line agent as a model: the prompt on its stdin, its stdout the text of
    the JSON contract. It runs with an allowlisted environment, in a fresh session,
    and is killed at `timeout_seconds`. toolfence gives it no tools: configure the
    agent itself with none (it must only answer; toolfence runs the calls)."""

    argv: tuple[str, ...]
    allow_env: tuple[str, ...] = ()
    timeout_seconds: float = CLI_TIMEOUT_SECONDS
    mode: str = JSON_MODE

    def environment(self, source: Mapping[str, str] | None = None) -> dict[str, str]:
        source = os.environ if source is None else source
        names = set(CLI_BASE_ENV) | set(self.allow_env)
        return {name: source[name] for name in sorted(names) if name in source}

    def call(self, request: ModelRequest) -> ModelResponse:
        import subprocess

        started = time.perf_counter()
        try:
            completed = subprocess.run(
                list(self.argv), input=request.prompt.encode("utf-8"), capture_output=True,
                env=self.environment(), timeout=self.timeout_seconds, start_new_session=True,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DriverError("cli_timeout", f"the agent did not answer in {self.timeout_seconds:g} s",
                              retryable=True) from None
        except OSError as exc:
            raise DriverError("cli_unavailable", f"cannot run the agent: {exc.strerror}") from None
        if completed.returncode != 0:
            raise DriverError("cli_failed", f"the agent exited with status {completed.returncode}",
                              retryable=True)
        text = completed.stdout[:CLI_MAX_OUTPUT_BYTES].decode("utf-8", "replace")
        usage = Usage(
            model=Path(self.argv[0]).name, purpose=request.purpose,
            input_tokens=len(request.prompt) // 4, output_tokens=len(text) // 4,
            latency_seconds=time.perf_counter() - started,
        )
        return ModelResponse(usage=usage, text=text)


def scripted_calls(path: str | Path) -> list[dict[str, Any]]:
    """The scripted driver's persisted call log (for tests and the demo)."""
    calls_path = Path(str(path) + ".calls")
    if not calls_path.exists():
        return []
    return [json.loads(line) for line in calls_path.read_text(encoding="utf-8").splitlines() if line]
