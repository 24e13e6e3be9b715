"""toolfence's errors: one base, `ToolfenceError`, and a base for each kind.

Catch `ToolfenceError` for anything toolfence refused or could not do, or one of
its kinds to branch:

- `ConfigurationError`: a setting, a tool declaration or the database's setup is
  wrong; fix it and start again (`SettingsError`, `DatabaseSettingError`,
  `SchemaNotReady`, `ToolDeclarationError`, ...).
- `AdmissionError`: a request, a call or its input was refused, or could not be
  decided, before anything was written for it (`InvalidIdentifier`,
  `InvalidBatch`, `AdmissionUnavailable`, ...).
- `StoreError`: the operation store refused a statement or lost its database
  (`StoreDatabaseError`, `ApproverUnavailable`).
- `ProviderError`: a provider adapter refused an envelope, or a surface cannot
  do what was asked of it (`AdapterError`, `NoApprovalResponse`).
- `TurnError`: a durable turn could not start or its model could not answer
  (`TurnInProgress`, `DriverError`).
- `HttpError`: `toolfence serve` refuses a request (`ProblemError`, `KeyRefused`).
- `WorkerError`: running an operation went wrong in toolfence's hands
  (`InvalidResult`, `TaskFailed`, `AmbiguousCommit`).
- `CommandError`: a `toolfence` command failed; printed as one line
  (`UserError`, `DemoError`).

Each concrete class lives beside the code that raises it, and keeps the
standard base callers caught before the family existed (`InvalidIdentifier` is
still a `ValueError`, `AmbiguousCommit` a `ConnectionError`).

Not in the family:

- What a tool raises, and what passes through a tool's code to the worker:
  `ToolFailure` (`RetryableError`, `TerminalError`, `BusinessRuleViolation`,
  `McpCallFailure`), `StaleFencingToken` and `LostOwnership`. They are the tool
  author's vocabulary; a tool that caught `ToolfenceError` around its own calls
  must not swallow the worker's signal that its lease is gone.
- Private control flow that never reaches a caller (`_NotStrict`, `_Refused`,
  `_DuplicateKey`, `_NonFinite`, and the demo's `_Terminated`, a
  `BaseException` like `KeyboardInterrupt`).

This module is a leaf: it imports nothing from toolfence, so the pure core can
import it.
"""

from __future__ import annotations


def _default_message(cls: type[BaseException]) -> str:
    """The first paragraph of the nearest docstring, on one line."""
    for klass in cls.__mro__:
        doc = klass.__dict__.get("__doc__")
        if isinstance(doc, str) and doc.strip():
            return " ".join(doc.strip().split("\n\n")[0].split())
    return ""


class ToolfenceError(Exception):
    """toolfence refused or could not do what was asked."""

    def __init__(self, *args: object) -> None:
        # Raised without arguments, the class's docstring is the message (as in
        # procrastinate's exceptions); with arguments, they are kept as given, so
        # the exception pickles and prints as before the family existed.
        super().__init__(*(args or (_default_message(type(self)),)))


class ConfigurationError(ToolfenceError):
    """A setting, a tool declaration or the database's setup is wrong: fix it and start again."""


class AdmissionError(ToolfenceError):
    """A request, a call or its input was refused, or could not be decided, before
    anything was written for it."""


class StoreError(ToolfenceError):
    """The operation store refused a statement or could not reach its database."""


class ProviderError(ToolfenceError):
    """A provider adapter refused an envelope, or a surface cannot do what was asked."""


class TurnError(ToolfenceError):
    """A durable turn could not start, or its model could not answer."""


class HttpError(ToolfenceError):
    """`toolfence serve` refuses the request."""


class WorkerError(ToolfenceError):
    """Running an operation went wrong in toolfence's hands (not the tool's failure)."""


class CommandError(ToolfenceError):
    """A `toolfence` command could not do what it was asked."""


__all__ = [
    "AdmissionError",
    "CommandError",
    "ConfigurationError",
    "HttpError",
    "ProviderError",
    "StoreError",
    "ToolfenceError",
    "TurnError",
    "WorkerError",
]
