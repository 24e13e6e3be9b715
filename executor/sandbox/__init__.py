"""Code execution as a tool: model-written Python in a bubblewrap sandbox (issue 29).

- `limits.py`: a run's limits and the program with its input files;
- `command.py`: the runtime (bubblewrap, the interpreter) and bwrap's command line;
- `inside.py`: the supervisor that runs inside the sandbox (its text, not imported);
- `runner.py`: the host's side of a run: the process group, the pipes, the deadline;
- `result.py`: the outcome and the result, sanitised and marked untrusted;
- `check.py`: which isolation features this machine provides;
- `tool.py`: the `sandbox.run_python` declaration (`run_python_tool`).

docs/tools.md §Code execution says what is enforced where.
"""

from __future__ import annotations

from executor.sandbox.command import SandboxUnavailable
from executor.sandbox.result import Outcome, OutputFile, SandboxResult
from executor.sandbox.tool import RunPythonArgs, run_python_tool

__all__ = ["Outcome", "OutputFile", "RunPythonArgs", "SandboxResult", "SandboxUnavailable", "run_python_tool"]
