"""Fast tests of `toolfence serve`'s pure parts: the OpenAPI document checked in,
provider names, the strict body reader, key parsing, console sessions."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from executor.http.body import strict_json
from executor.http.keys import KeyRefused, KeyScope, identity_of, parse_scopes, split_key
from executor.http.models import PROVIDER_NAMES, ProviderName
from executor.http.problems import ProblemError
from executor.providers import SURFACES
from executor.store.api_keys import ApiKeyRecord

ROOT = Path(__file__).resolve().parents[2]


def test_openapi__served_document__equals_the_checked_in_one() -> None:
    # Given the document the server serves; when it is compared with docs/openapi.json
    from executor.http.openapi import render

    served = render()
    checked_in = (ROOT / "docs" / "openapi.json").read_text(encoding="utf-8")
    # Then they are the same (regenerate: python -m executor.http.openapi > docs/openapi.json)
    assert json.loads(served) == json.loads(checked_in), (
        "docs/openapi.json drifted: python -m executor.http.openapi > docs/openapi.json"
    )


def test_openapi__every_v1_operation__documents_bearer_auth_and_problems() -> None:
    from executor.http.openapi import document

    doc = document()
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            if not path.startswith("/v1"):
                continue
            assert operation.get("security") == [{"HTTPBearer": []}], (method, path)
            for status in ("401", "403", "404", "429"):
                assert "application/problem+json" in operation["responses"][status]["content"], (path, status)


def test_provider_name__literal__is_every_surface() -> None:
    literal = typing.get_args(ProviderName)[0]
    assert set(typing.get_args(literal)) == set(PROVIDER_NAMES) == set(SURFACES)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"a": 1, "a": 2}', "duplicate_key"),
        (b'{"a": NaN}', "non_finite_number"),
        (b'{"a": Infinity}', "non_finite_number"),
        (b"[" * 65 + b"]" * 65, "too_deep"),
        (b'{"a": "\\u0000"}', "invalid_text"),
        (b'{"\\ud800": 1}', "invalid_text"),
        (b"\xff\xfe", "invalid_utf8"),
        (b'{"a": ', "invalid_json"),
    ],
)
def test_strict_json__refused_input__invalid_request_with_the_cause(raw: bytes, code: str) -> None:
    with pytest.raises(ProblemError) as refused:
        strict_json(raw)
    assert refused.value.status == 400
    assert [e.code for e in refused.value.errors] == [code]


def test_strict_json__ordinary_document__parsed() -> None:
    assert strict_json(b'{"calls": [{"x": [1, 2.5, "\\u00e9"]}]}') == {"calls": [{"x": [1, 2.5, "é"]}]}
    assert strict_json(b"[" * 64 + b"]" * 64) is not None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "tfk_",
        "tfk_short_secret",
        "xyz_0123456789abcdef_secret",
        "tfk_0123456789abcdef_",
        "tfk_" + "a" * 300,
    ],
)
def test_split_key__not_a_key__refused(text: str) -> None:
    with pytest.raises(KeyRefused):
        split_key(text)


def test_split_key__a_key__id_and_secret() -> None:
    # The secret may itself hold underscores (token_urlsafe)
    assert split_key("tfk_0123456789abcdef_se_cr-et") == ("0123456789abcdef", "se_cr-et")


@pytest.mark.parametrize("surface", ["chat", None])
def test_identity_of__key_with_or_without_a_surface__every_context_it_makes_names_it(
    surface: str | None,
) -> None:
    # Given a key's row, with or without a turn surface
    record = ApiKeyRecord(
        key_id="0123456789abcdef", tenant="acme", principal="alice", roles=frozenset({"member"}),
        scopes=frozenset({"produce", "approve"}), secret_hash="$argon2id$…", label=None,
        created_at=0.0, revoked_at=None, surface=surface,
    )
    # When its identity makes the contexts of a request, a turn and an approval
    who = identity_of(record)
    contexts = [who.context("req-1", "conv-1"), who.context("turn_1"), who.context("http-approval")]
    # Then each names the key's surface (requests are admitted under it, not only turns)
    assert who.surface == surface
    assert [c.surface for c in contexts] == [surface] * 3
    assert (contexts[0].principal, contexts[0].conversation_id) == ("alice", "conv-1")


def test_parse_scopes__known_and_unknown() -> None:
    assert parse_scopes(["produce", " read "]) == {KeyScope.PRODUCE, KeyScope.READ}
    with pytest.raises(ValueError, match="produce, approve, operate, read"):
        parse_scopes(["admin"])


def test_console_session__tampered_or_expired__no_key_id() -> None:
    from executor.http.console import _Sessions

    sessions = _Sessions(b"k" * 32, lifetime=60)
    cookie = sessions.issue("0123456789abcdef")
    read = sessions.read(cookie)
    assert read is not None and read.key_id == "0123456789abcdef" and len(read.session_id) == 32
    assert sessions.read(sessions.issue("0123456789abcdef")) != read  # each sign-in its own session
    payload, _, mac = cookie.rpartition(".")
    assert sessions.read(payload + "." + "0" * len(mac)) is None
    assert _Sessions(b"x" * 32, lifetime=60).read(cookie) is None  # another secret
    expired = _Sessions(b"k" * 32, lifetime=-1).issue("0123456789abcdef")
    assert sessions.read(expired) is None
    assert sessions.csrf(cookie) != sessions.csrf(sessions.issue("0123456789abcdef") + "x")
