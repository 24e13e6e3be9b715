"""The MCP sanitiser: what it redacts, and that it does so in time linear in its input.

A hostile MCP server chooses its answer; a pattern that is quadratic in some
input lets 16,000 characters hold the GIL for seconds (the worker's heartbeat
starves and its lease is lost). Timing is asserted only as ratios measured in
the same test: against plain text of the same length, and at 2n against n.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest
from sanitize_timing import assert_linear

from executor.core.sanitize import AWS_KEY_ID, GITHUB_TOKEN, STRIPE_KEYS
from executor.mcp.sanitize import REDACTED, redact, redact_json

# ---------------------------------------------------------------- the reference

# The boundary-anchored patterns the linear ones replaced: simple to read and
# quadratic on some inputs. Short inputs cost nothing, so on those the linear
# patterns must redact exactly what these do.
_NAME = r"[\w.-]*?"
_PASSWORD = (
    r"(?:api[_-]?key|apikey|(?:secret|private|signing|access)[_-]?key|secret|passw(?:or)?d|pwd|"
    r"passphrase|credentials?|auth(?:orization)?|cookie)"
)
_TOKEN = r"(?:token|session[_-]?id)"
_SEP = r"(?P<sep>[\"']?\s*[:=]\s*[\"']?)"
# A value some earlier pattern already redacted is left alone (sanitising twice
# changes nothing).
_KEPT = r"(?!\[REDACTED\])"
REFERENCE: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
        ),
        REDACTED,
    ),
    (re.compile(r"(?i)\b(Bearer|Basic|Token)\s+[A-Za-z0-9\-._~+/]{6,}=*"), rf"\1 {REDACTED}"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), rf"\1{REDACTED}@"),
    (
        re.compile(
            rf"(?i)\b(?P<key>{_NAME}{_PASSWORD}(?![A-Za-z0-9])){_SEP}(?P<value>{_KEPT}[^\s\"'&,;}}\]]+)"
        ),
        rf"\g<key>\g<sep>{REDACTED}",
    ),
    (
        re.compile(
            rf"(?i)\b(?P<key>{_NAME}{_TOKEN}(?![A-Za-z0-9])){_SEP}"
            rf"(?P<value>{_KEPT}(?!\d{{1,5}}(?:[\s\"'&,;}}\]]|$))[^\s\"'&,;}}\]]+)"
        ),
        rf"\g<key>\g<sep>{REDACTED}",
    ),
    (
        re.compile(
            r"\b(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
            r"xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|"
            r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
        ),
        REDACTED,
    ),
    # The shapes added after these (detect-secrets' and Stripe-style keys) are
    # already of the simple form: they are their own reference.
    (re.compile(rf"\b(?:{AWS_KEY_ID}|{GITHUB_TOKEN}|{'|'.join(STRIPE_KEYS)})"), REDACTED),
    (re.compile(r"\b[rs]k\\?_(?:live|test)\\?_[0-9a-zA-Z]{8,}"), REDACTED),
)


def reference_redact(text: str) -> str:
    for pattern, replacement in REFERENCE:
        text = pattern.sub(replacement, text)
    return text


# Pieces that make the patterns' starts, runs and separators meet in every way.
ATOMS = [
    "a", "x", "1", "7", ".", "-", "_", "+", "/", ":", "=", "@", " ", '"', "'", "&", ",", ";", "}",
    "]", "é", "\n", "token", "Token", "password", "pwd", "api_key", "apikey", "secret",
    "session_id", "auth", "cookie", "eyJ", "sk-", "ghp_", "xoxb-", "AKIA", "://", "http",
    "Bearer ", "Basic ", "-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----",
    "ABCDEFGHIJKLMNOP", "abcdefgh", "12345", "123456",
]


# ---------------------------------------------------------------- what it redacts


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("token=tok_live_9f8e7d", "token=[REDACTED]"),
        ('{"api_key": "AKIAQWERTYUIOPASDFGH"}', '{"api_key": "[REDACTED]"}'),
        ("db.password: hunter2; next", "db.password: [REDACTED]; next"),
        ("fencingToken: 3", "fencingToken: 3"),
        ("max_tokens=4096", "max_tokens=4096"),
        ("Authorization: Bearer abcdef123456", "Authorization: [REDACTED] [REDACTED]"),
        ("Bearer abcdef123456", "Bearer [REDACTED]"),
        ("see https://user:pw@example.com/x", "see https://[REDACTED]@example.com/x"),
        ("1-http://user:pw@example.com", "1-http://[REDACTED]@example.com"),
        ("key sk-abcdefghijklmnop1234 end", "key [REDACTED] end"),
        ("x-eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl!", "x-[REDACTED]!"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----", REDACTED),
    ],
)
def test_redact__secret_shapes__redacted_and_their_surroundings_kept(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_redact__random_short_inputs__exactly_what_the_boundary_anchored_patterns_redact() -> None:
    rnd = random.Random(20_240_611)
    for _ in range(30_000):
        text = "".join(rnd.choice(ATOMS) for _ in range(rnd.randint(1, 24)))
        assert redact(text) == reference_redact(text), text


def test_redact_json__secret_named_members_and_shaped_strings_redacted() -> None:
    value = {"password": "x", "sessionId": "abc", "fencingToken": 3, "note": "token=abcdef1"}

    assert redact_json(value) == {
        "password": REDACTED, "sessionId": REDACTED, "fencingToken": 3, "note": f"token={REDACTED}",
    }


# ---------------------------------------------------------------- how long it takes




ADVERSARIAL: dict[str, Callable[[int], str]] = {
    "dotted words": lambda n: ("a." * n)[:n],
    "key-like run": lambda n: ("a_b-c" * n)[:n],
    "equals signs": lambda n: "=" * n,
    "nested quotes": lambda n: ("\"'" * n)[:n],
    "base64 run": lambda n: ("QUJD+/" * n)[:n],
    "jwt-like run": lambda n: ("eyJ-" * n)[:n],
    "secret words": lambda n: ("a.password" * n)[:n],
    "token words": lambda n: ("token" * n)[:n],
    "separators": lambda n: ("x: " * n)[:n],
    "api key prefixes": lambda n: ("sk-" * n)[:n],
    "github prefixes": lambda n: ("ghp-" * n)[:n],
    "slack prefixes": lambda n: ("xoxa." * n)[:n],
    "url schemes": lambda n: ("a://" * n)[:n],
    "url userinfo": lambda n: ("a://b:" + "c" * n)[:n],
    "pem header": lambda n: ("-----BEGIN " + "A " * n)[:n],
    "bearer spaces": lambda n: ("Bearer" + " " * n)[:n],
}


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_sanitize__adversarial_input__time_linear_in_its_length(shape: str) -> None:
    assert_linear(shape, ADVERSARIAL[shape])
