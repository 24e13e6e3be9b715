"""Make third-party text safe to store and to show a model.

An MCP server is someone else's code: everything it returns passes through the
one sanitiser every model-facing output uses (`executor.core.sanitize`). These
names stay importable from here for the MCP modules and their callers.
"""

from __future__ import annotations

from executor.core.sanitize import (
    REDACTED,
    TRUNCATION_MARK,
    cap,
    redact,
    redact_json,
    sanitize_error_text,
    sanitize_text,
    seal_json,
)

__all__ = [
    "REDACTED",
    "TRUNCATION_MARK",
    "cap",
    "redact",
    "redact_json",
    "sanitize_error_text",
    "sanitize_text",
    "seal_json",
]
