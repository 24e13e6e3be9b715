"""What a sandboxed run may use, and the program it runs.

`Limits` are one run's; the operator's maxima (`TOOLFENCE_SANDBOX_MAX_TIMEOUT_SECONDS`,
`TOOLFENCE_SANDBOX_MAX_MEMORY_MB`) bound what a call may ask for (`Limits.within`).
Where each limit is enforced is docs/tools.md §Code execution's table.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from executor.errors import ConfigurationError

MiB = 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_MEMORY_MB = 256
MIN_MEMORY_MB = 64
"""Below this the interpreter itself cannot start under the address-space limit."""
MAX_CODE_BYTES = 64 * 1024
MAX_INPUT_FILES = 16
MAX_INPUT_BYTES = 256 * 1024
"""All input files of one run together (the program's text not included)."""
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
MAIN = "main.py"


class InvalidProgram(ConfigurationError, ValueError):
    """A program or its input files break the sandbox's rules (size, names)."""


@dataclass(frozen=True)
class Limits:
    """One run's limits. The defaults are what a call gets when it asks for nothing."""

    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    memory_mb: int = DEFAULT_MEMORY_MB
    max_processes: int = 32
    max_file_bytes: int = 16 * MiB
    max_open_files: int = 64
    workdir_bytes: int = 64 * MiB
    tmp_bytes: int = 16 * MiB
    # Per stream: more than this ends the run `output_limit` at once.
    max_output_bytes: int = 1 * MiB
    # Per stream: how much of it the result shows (sanitised, marked when cut).
    shown_output_chars: int = 8_000
    # Files described in the result; a run that leaves more ends `output_limit`.
    max_files: int = 64
    max_text_file_bytes: int = 8 * 1024
    # How long the host waits past the timeout for the sandbox's own teardown
    # (describing the files) before it kills the whole namespace itself.
    grace_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise InvalidProgram(
                f"timeout must be a positive number of seconds, not {self.timeout_seconds!r}"
            )
        if self.memory_mb < MIN_MEMORY_MB:
            raise InvalidProgram(f"memory must be at least {MIN_MEMORY_MB} MiB, not {self.memory_mb}")
        for name in (
            "max_processes", "max_file_bytes", "max_open_files", "workdir_bytes", "tmp_bytes",
            "max_output_bytes", "shown_output_chars", "max_files", "max_text_file_bytes",
        ):
            if getattr(self, name) < 1:
                raise InvalidProgram(f"{name} must be at least 1")

    @property
    def cpu_seconds(self) -> int:
        """CPU seconds per process: the wall-clock timeout, rounded up."""
        return max(1, math.ceil(self.timeout_seconds))

    def within(self, max_timeout_seconds: float, max_memory_mb: int) -> Limits:
        """These limits, each held to the operator's maximum (never raised by it)."""
        return replace(
            self,
            timeout_seconds=min(self.timeout_seconds, max_timeout_seconds),
            memory_mb=min(self.memory_mb, max_memory_mb),
        )

    def for_job(self) -> dict[str, Any]:
        """What the supervisor inside the sandbox is told (executor/sandbox/inside.py)."""
        job = asdict(self)
        job["cpu_seconds"] = self.cpu_seconds
        return job


@dataclass(frozen=True)
class Program:
    """A Python program's text and its input files (name → UTF-8 text), written
    into the sandbox's work directory beside it as `main.py`."""

    code: str
    files: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise InvalidProgram(f"the program is over {MAX_CODE_BYTES} bytes")
        if len(self.files) > MAX_INPUT_FILES:
            raise InvalidProgram(f"at most {MAX_INPUT_FILES} input files")
        seen: set[str] = set()
        total = 0
        for name, content in self.files:
            if not FILE_NAME_RE.match(name) or name in (MAIN, ".", ".."):
                raise InvalidProgram(
                    "an input file's name is letters, digits, '.', '_' or '-' "
                    f"(at most 64, not starting with '.' or '-', not {MAIN})"
                )
            if name in seen:
                raise InvalidProgram("each input file's name at most once")
            seen.add(name)
            total += len(content.encode("utf-8", "surrogatepass"))
        if total > MAX_INPUT_BYTES:
            raise InvalidProgram(f"the input files are over {MAX_INPUT_BYTES} bytes together")
        for text in (self.code, *(content for _, content in self.files)):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidProgram("the program and its files must be UTF-8 text") from None
