"""Make third-party text safe to store and to show a model.

An MCP server is someone else's code: its error messages and outputs can carry
credentials it read from its environment, terminal escape sequences, or text
written to steer the model. Everything it returns passes through here: control
characters are dropped, anything shaped like a secret is redacted, and the text
is capped. Redaction runs on successful outputs too, not only on errors: a
leaked token is just as leaked in a result.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"
TRUNCATION_MARK = "…[truncated]"

# Names that mark the value after them as a credential (`token=…`, `"api_key": "…"`):
# the name must end with the secret word, so `max_tokens` or `tokenizer` are not.
# After a token-like name a short run of digits is a count or a generation
# number (`fencingToken: 3`), not a credential; after a password it is a PIN.
_NAME_PREFIX = r"[\w.-]*?"
_NAME_END = r"(?![A-Za-z0-9])"
_PASSWORD_WORDS = (
    r"(?:api[_-]?key|apikey|(?:secret|private|signing|access)[_-]?key|secret|passw(?:or)?d|pwd|"
    r"passphrase|credentials?|auth(?:orization)?|cookie)"
)
_TOKEN_WORDS = r"(?:token|session[_-]?id)"
_PASSWORD_NAME_RE = re.compile(rf"^{_NAME_PREFIX}{_PASSWORD_WORDS}{_NAME_END}$", re.IGNORECASE)
_TOKEN_NAME_RE = re.compile(rf"^{_NAME_PREFIX}{_TOKEN_WORDS}{_NAME_END}$", re.IGNORECASE)
_SHORT_NUMBER_RE = re.compile(r"^\d{1,5}$")
_VALUE_END = r"[\s\"'&,;}\]]"
_SEPARATOR = r"(?P<sep>[\"']?\s*[:=]\s*[\"']?)"

# Every pattern runs in time linear in its input. A regex that may start at
# every position and then scan a long run before failing (`\b[\w.-]*?token`
# from each boundary of "a.a.a.…") is quadratic, and a hostile server's 16,000
# characters then hold the GIL for seconds. So each pattern starts only where a
# run of the characters it scans begins (a negative lookbehind), scans that run
# once (possessive or atomic), and keeps what it skipped of the run (`lead`):
# it redacts exactly what the boundary-anchored form would, from fewer starts.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM blocks first: their body spans lines the other patterns would only nibble at.
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
            re.DOTALL,
        ),
        REDACTED,
    ),
    (re.compile(r"(?i)\b(Bearer|Basic|Token)\s+[A-Za-z0-9\-._~+/]{6,}=*"), rf"\1 {REDACTED}"),
    # user:password@host in URLs. The scheme starts at a letter after a boundary;
    # every such start in one run of scheme characters ends at the same "://",
    # so the run is matched whole, from its first character, and kept.
    (
        re.compile(
            r"(?i)(?<![a-z0-9+.-])(?P<scheme>(?>(?<!\w)[a-z]|[a-z0-9+.-]*?[+.-][a-z])[a-z0-9+.-]*+://)"
            r"[^/\s:@]++:[^/\s@]++@"
        ),
        rf"\g<scheme>{REDACTED}@",
    ),
    # key=value, key: value, "key": "value" (the value stops at a delimiter).
    # The separator cannot start inside a name, so a name is a whole run of
    # name characters ending in the secret word.
    (
        re.compile(
            rf"(?i)(?<![\w.-])(?P<key>{_NAME_PREFIX}{_PASSWORD_WORDS})(?![\w.-]){_SEPARATOR}"
            rf"(?P<value>[^\s\"'&,;}}\]]++)"
        ),
        rf"\g<key>\g<sep>{REDACTED}",
    ),
    (
        re.compile(
            rf"(?i)(?<![\w.-])(?P<key>{_NAME_PREFIX}{_TOKEN_WORDS})(?![\w.-]){_SEPARATOR}"
            rf"(?P<value>(?!\d{{1,5}}(?:{_VALUE_END}|$))[^\s\"'&,;}}\]]++)"
        ),
        rf"\g<key>\g<sep>{REDACTED}",
    ),
    # Well-known token shapes that appear without a name in front of them.
    (
        re.compile(
            r"\b(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
            r"xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})"
        ),
        REDACTED,
    ),
    # JWTs: every "eyJ" in one run of base64url characters reaches the same ".",
    # so only the run's first one is tried (atomic), and the run's lead is kept.
    (
        re.compile(
            r"(?<![A-Za-z0-9_-])(?P<lead>(?>[A-Za-z0-9_-]*?\b(?=eyJ)))"
            r"eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+"
        ),
        rf"\g<lead>{REDACTED}",
    ),
)

# C0/C1 controls except tab and newline: escape sequences can rewrite what a
# person reviewing the text in a terminal sees.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def redact(text: str) -> str:
    """Replace anything shaped like a credential with `[REDACTED]`."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def cap(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to at most `limit` characters (mark included); and whether it was cut."""
    if len(text) <= limit:
        return text, False
    keep = max(0, limit - len(TRUNCATION_MARK))
    return text[:keep] + TRUNCATION_MARK, True


def sanitize_text(text: str, limit: int) -> tuple[str, bool]:
    """Controls dropped, secrets redacted, length capped; returns (text, truncated).

    The raw text is pre-cut before the regexes run so a hostile multi-megabyte
    answer costs bounded time; a secret split by that cut loses its tail,
    which is dropped anyway.
    """
    pre_cut = len(text) > 4 * limit + 256
    if pre_cut:
        text = text[: 4 * limit + 256]
    text = redact(_CONTROL_RE.sub("", text))
    text, cut = cap(text, limit)
    return text, cut or pre_cut


def sanitize_error_text(text: str, limit: int = 500) -> str:
    return sanitize_text(text, limit)[0]


def redact_json(value: Any, *, max_depth: int = 64) -> Any:
    """A JSON value with secret-named members and secret-shaped strings redacted."""
    if max_depth <= 0:
        return REDACTED
    if isinstance(value, str):
        return redact(_CONTROL_RE.sub("", value))
    if isinstance(value, Mapping):
        return {
            str(key): (
                REDACTED
                if _is_secret_member(str(key), item)
                else redact_json(item, max_depth=max_depth - 1)
            )
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_json(item, max_depth=max_depth - 1) for item in value]
    return value


def _is_secret_member(name: str, item: Any) -> bool:
    if not isinstance(item, str | int | float) or isinstance(item, bool):
        return False
    if _PASSWORD_NAME_RE.match(name):
        return True
    return bool(_TOKEN_NAME_RE.match(name)) and not _SHORT_NUMBER_RE.match(str(item))
