"""The one sanitiser for everything a model (or a stored result) is shown.

A tool's output and its error messages can carry credentials it read from its
environment or from a web page, terminal escape sequences, or text written to
steer the model. Every model-facing output passes through here, whoever wrote
it (a tool, an MCP server, a business rule): control characters are dropped,
anything shaped like a secret is redacted, and the text is capped. Redaction
runs on successful outputs too, not only on errors: a leaked token is just as
leaked in a result.

Markdown converters (mcp-server-fetch) escape underscores, so `api\\_key=…`
and `AWS\\_SECRET\\_ACCESS\\_KEY=…` are matched like their plain forms. The
shapes of AWS key ids, Stripe and GitHub tokens are detect-secrets' own
(`detect_secrets.plugins.*` denylists; tests/unit/test_core_sanitize.py keeps
them in step); its JWT pattern is not used: it is quadratic on a run of "eyJ".
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
# Name characters include the backslash of a markdown-escaped underscore (`\\_`):
# one character class, not an alternation, so the lazy scan stays cheap.
_NAME_PREFIX = r"[\w.\\-]*?"
_NAME_END = r"(?![A-Za-z0-9])"
# `_` or `-` between the words of a name, maybe escaped: `api_key`, `api\\_key`.
_JOIN = r"(?:\\?[_-])"
_PASSWORD_WORDS = (
    rf"(?:api{_JOIN}?key|apikey|(?:secret|private|signing|access){_JOIN}?key|secret|"
    r"passw(?:or)?d|pwd|passphrase|credentials?|auth(?:orization)?|cookie)"
)
_TOKEN_WORDS = rf"(?:token|session{_JOIN}?id)"
_PASSWORD_NAME_RE = re.compile(rf"^{_NAME_PREFIX}{_PASSWORD_WORDS}{_NAME_END}$", re.IGNORECASE)
_TOKEN_NAME_RE = re.compile(rf"^{_NAME_PREFIX}{_TOKEN_WORDS}{_NAME_END}$", re.IGNORECASE)
_SHORT_NUMBER_RE = re.compile(r"^\d{1,5}$")
_VALUE_END = r"[\s\"'&,;}\]]"
# A value runs to a delimiter; a backslash before a quote is that quote's escape
# (JSON quoted inside a string), kept with it.
# A value already redacted is left alone, so sanitising twice changes nothing.
_VALUE = r"(?!\[REDACTED\])(?:[^\s\"'&,;}\]\\]|\\(?![\"']))++"
_SEPARATOR = r"(?P<sep>\\?[\"']?\s*[:=]\s*\\?[\"']?)"
# A name starts where a run of name characters starts, and ends where the run
# does (a backslash that escapes a quote is not part of it).
_NAME_START = r"(?<![\w.\\-])"
_NAME_STOP = r"(?![\w.-]|\\_)"

# Key shapes, as detect-secrets' plugins write them (aws.AWSKeyDetector,
# stripe.StripeDetector, github_token.GitHubTokenDetector): each is a literal
# prefix and a bounded run, linear from every start.
AWS_KEY_ID = r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}"
STRIPE_KEYS = (r"(?:r|s)k_live_[0-9a-zA-Z]{24}",)
GITHUB_TOKEN = r"(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}"

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
            rf"(?i){_NAME_START}(?P<key>{_NAME_PREFIX}{_PASSWORD_WORDS}){_NAME_STOP}{_SEPARATOR}"
            rf"(?P<value>{_VALUE})"
        ),
        rf"\g<key>\g<sep>{REDACTED}",
    ),
    (
        re.compile(
            rf"(?i){_NAME_START}(?P<key>{_NAME_PREFIX}{_TOKEN_WORDS}){_NAME_STOP}{_SEPARATOR}"
            rf"(?P<value>(?!\d{{1,5}}(?:{_VALUE_END}|$)){_VALUE})"
        ),
        rf"\g<key>\g<sep>{REDACTED}",
    ),
    # Well-known token shapes that appear without a name in front of them.
    (
        re.compile(
            r"\b(?:sk-(?:[A-Za-z0-9_-]|\\_){16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
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
    # After the shapes above, so what they redacted before stays exactly as it was.
    (re.compile(rf"\b(?:{AWS_KEY_ID}|{GITHUB_TOKEN}|{'|'.join(STRIPE_KEYS)})"), REDACTED),
    # Stripe-style keys of any length (sk_live_, rk_test_, …), also markdown-escaped.
    (re.compile(r"\b[rs]k\\?_(?:live|test)\\?_[0-9a-zA-Z]{8,}"), REDACTED),
)

# C0/C1 controls except tab and newline: escape sequences can rewrite what a
# person reviewing the text in a terminal sees.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


REDACT_MAX_CHARS = 65_536
"""The most text `redact` keeps of one string, and `redact_json` of all of a value's
strings and names together: the patterns are linear, but about 0.6 µs a character
(1.6 MB of an MCP server's `structuredContent` held the GIL for 2.1 s)."""
# A secret that crosses the pre-cut is cut before it is scanned, so a pattern may
# not recognise its head; the margin keeps such a head past the final cap.
_PRE_CUT_MARGIN = 1_024


def redact(text: str, limit: int = REDACT_MAX_CHARS) -> str:
    """Replace anything shaped like a credential with `[REDACTED]`.

    Text longer than `limit` characters is cut (ending in `TRUNCATION_MARK`), and
    cut *before* it is scanned, so a hostile multi-megabyte string costs what
    `limit` characters cost, as in `sanitize_text`.
    """
    pre_cut = len(text) > limit + _PRE_CUT_MARGIN
    if pre_cut:
        text = text[: limit + _PRE_CUT_MARGIN]
    return _finish(_redact(text), limit, pre_cut, _PRE_CUT_MARGIN)[0]


def _finish(text: str, limit: int, pre_cut: bool, margin: int) -> tuple[str, bool]:
    """`text`, scanned, capped at `limit`. When the raw text was pre-cut, its last
    `margin` characters may hold the head of a secret the cut made unrecognisable:
    they are dropped too, and the mark always says the text was cut (redaction and
    dropped controls can leave the scanned text shorter than `limit`)."""
    if pre_cut:
        keep = max(0, min(limit, len(text) - margin) - len(TRUNCATION_MARK))
        return text[:keep] + TRUNCATION_MARK, True
    return cap(text, limit)


def _redact(text: str) -> str:
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
    return _finish(_redact(_CONTROL_RE.sub("", text)), limit, pre_cut, 256)


def sanitize_error_text(text: str, limit: int = 500) -> str:
    return sanitize_text(text, limit)[0]


def redact_json(value: Any, *, max_depth: int = 64, limit: int = REDACT_MAX_CHARS) -> Any:
    """A JSON value with secret-named members and secret-shaped strings redacted
    (controls dropped), its structure kept, capped at about `limit` characters of
    JSON text as `sanitize_json` caps it: what is past the cap is cut before it is
    scanned, so the cost is bounded by `limit` whatever the value's size."""
    return seal_json(value, limit, max_depth=max_depth)[0]


def _is_secret_member(name: str, item: Any) -> bool:
    if not isinstance(item, str | int | float) or isinstance(item, bool):
        return False
    if _PASSWORD_NAME_RE.match(name):
        return True
    return bool(_TOKEN_NAME_RE.match(name)) and not _SHORT_NUMBER_RE.match(str(item))


# What a model is shown of one result at most (the MCP default cap, too).
MODEL_VIEW_MAX_CHARS = 16_000
# What a model is shown of one tool-written error message at most.
ERROR_MESSAGE_MAX_CHARS = 500


def sanitize_json(value: Any, limit: int = MODEL_VIEW_MAX_CHARS) -> Any:
    """A JSON value made safe to show a model, its structure kept.

    Strings are sanitised (controls, secrets) and secret-named members redacted,
    as `redact_json` does; the whole is capped at about `limit` characters of
    JSON text: a string that crosses the budget is cut with `TRUNCATION_MARK`,
    list items past it are replaced by one `TRUNCATION_MARK` item, and mapping
    members past it by one member named `TRUNCATION_MARK` (the count dropped).
    Each string is pre-cut to what the remaining budget can keep before the
    regexes run, so the cost is linear in what is kept, not in what was sent.
    """
    return seal_json(value, limit)[0]


TRUNCATED_FLAG = "truncated"
"""A mapping's own marker that part of it was cut (an MCP output's `truncated`)."""


def seal_json(value: Any, limit: int, *, max_depth: int = 64) -> tuple[Any, bool]:
    """`sanitize_json`'s value, and whether anything was cut (or redacted for depth).

    The cap never hides that it cut: in every mapping, the members that are not a
    string or a container (flags, numbers, null) are kept before the others are
    given the rest of the budget, so a short flag after a long text survives; and a
    mapping's boolean `truncated` member (`TRUNCATED_FLAG`) becomes true when
    anything inside that mapping was cut here. Members keep their order.
    """
    sealer = _Sealer(limit)
    sealed = sealer.seal(value, max_depth)
    return sealed, sealer.cuts > 0


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float)


class _Sealer:
    def __init__(self, limit: int) -> None:
        self.remaining = limit
        self.cuts = 0

    def seal(self, value: Any, depth: int) -> Any:
        if depth <= 0:
            self.remaining -= len(REDACTED) + 2
            self.cuts += 1
            return REDACTED
        if isinstance(value, str):
            text, cut = sanitize_text(value, max(self.remaining - 2, 0))
            self.remaining -= len(text) + 2
            self.cuts += cut
            return text
        if isinstance(value, Mapping):
            return self._seal_mapping(value, depth)
        if isinstance(value, list | tuple):
            kept: list[Any] = []
            self.remaining -= 2
            for item in value:
                if self.remaining <= 0:
                    kept.append(TRUNCATION_MARK)
                    self.cuts += 1
                    break
                kept.append(self.seal(item, depth - 1))
                self.remaining -= 2  # ", "
            return kept
        self.remaining -= len(str(value)) + 1
        return value

    def _seal_mapping(self, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        self.remaining -= 2
        cuts_before = self.cuts
        # Scalars first (their cost is known and small), then strings and containers
        # in order with what is left; assembled in the mapping's own order.
        members = list(value.items())
        order = [i for i, (_, item) in enumerate(members) if _is_scalar(item)]
        order += [i for i, (_, item) in enumerate(members) if not _is_scalar(item)]
        sealed_at: dict[int, tuple[str, Any]] = {}
        for position, index in enumerate(order):
            key, item = members[index]
            name = sanitize_text(str(key), 256)[0]
            if self.remaining <= len(name) + 6:
                self.cuts += 1
                dropped = len(order) - position
                break
            self.remaining -= len(name) + 6  # quotes, ": " and ", "
            if _is_secret_member(str(key), item):
                self.remaining -= len(REDACTED) + 2
                sealed_at[index] = (name, REDACTED)
            else:
                sealed_at[index] = (name, self.seal(item, depth - 1))
        else:
            dropped = 0
        sealed = dict(sealed_at[index] for index in sorted(sealed_at))
        if dropped:
            sealed[TRUNCATION_MARK] = dropped
        if self.cuts > cuts_before and isinstance(sealed.get(TRUNCATED_FLAG), bool):
            sealed[TRUNCATED_FLAG] = True
        return sealed


def seal_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """A stored error (`{"message", "details", …}`) with its tool-written text sanitised."""
    sealed = dict(error)
    if "message" in sealed:
        sealed["message"] = sanitize_error_text(str(sealed["message"]), ERROR_MESSAGE_MAX_CHARS)
    if "details" in sealed:
        sealed["details"] = sanitize_json(sealed["details"], 4 * ERROR_MESSAGE_MAX_CHARS)
    return sealed


# What a person is shown of one stored name (a principal, a tenant, an actor, a key
# label, a request or call id in an operator's output) at most: an identifier's length.
SHOWN_TEXT_MAX_CHARS = 200
# What is stored (and so shown to anyone) of a turn's final answer at most.
FINAL_OUTPUT_MAX_CHARS = 100_000


def shown_text(text: str, limit: int = SHOWN_TEXT_MAX_CHARS) -> str:
    """A stored name as a person (an operator's terminal, the console, the API) or a
    model is shown it: controls dropped, anything shaped like a secret redacted (an
    application that made a key's principal `sk-…` leaks it in every listing), capped.
    The one rule for every such field, wherever it is shown."""
    return sanitize_text(text, limit)[0]


def seal_final_output(text: str | None) -> str | None:
    """A turn's final answer as it is stored, and so as everyone is shown it: the
    model wrote it, from tool results and a prompt that may hold a credential, and
    it goes to the user, the console and the API. Sanitised like every model-facing
    output (controls other than tab and newline dropped, secrets redacted), capped at
    `FINAL_OUTPUT_MAX_CHARS`."""
    return None if text is None else sanitize_text(text, FINAL_OUTPUT_MAX_CHARS)[0]


LOG_MESSAGE_MAX_CHARS = 300


def exception_summary(exc: BaseException, limit: int = LOG_MESSAGE_MAX_CHARS) -> str:
    """An exception as a log line may show it: its type, the first line of its
    message through this sanitiser (secret-shaped text redacted, controls dropped,
    capped), and where it was raised (file:line of the innermost frames, never a
    frame's values). A traceback would print the message unredacted, and a tool's
    exception, a driver's error or a chained cause can quote arguments or context."""
    import traceback

    lines = str(exc).strip().splitlines()
    message = sanitize_error_text(lines[0], limit) if lines else ""
    frames = traceback.extract_tb(exc.__traceback__)[-3:] if exc.__traceback__ is not None else []
    where = " < ".join(f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" for frame in reversed(frames))
    summary = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return f"{summary} (at {where})" if where else summary

