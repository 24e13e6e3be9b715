"""The identifier contract and the strict JSON loader, pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.core.identifiers import (
    MAX_IDENTIFIER_CHARS,
    IdentifierField,
    IdentifierProblem,
    InvalidIdentifier,
    check_server_context,
    identifier_problem,
    storable_key,
)
from executor.core.strictjson import StrictJSONError, loads_strict
from executor.core.types import ServerContext


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param(5, IdentifierProblem.NOT_TEXT, id="not_text"),
        pytest.param("", IdentifierProblem.EMPTY, id="empty"),
        pytest.param("x" * (MAX_IDENTIFIER_CHARS + 1), IdentifierProblem.TOO_LONG, id="too_long"),
        pytest.param("a\x00b", IdentifierProblem.NUL, id="nul"),
        pytest.param("a\ud800", IdentifierProblem.LONE_SURROGATE, id="lone_surrogate"),
        pytest.param("a\tb", IdentifierProblem.NOT_PRINTABLE, id="tab"),
        pytest.param("a\u2028b", IdentifierProblem.NOT_PRINTABLE, id="line_separator"),
        pytest.param("\u202eevil", IdentifierProblem.NOT_PRINTABLE, id="bidi_override"),
    ],
)
def test_identifier_problem__bad_value__named(value: object, problem: IdentifierProblem) -> None:
    assert identifier_problem(value) is problem


@pytest.mark.parametrize("value", ["call_1", "x" * MAX_IDENTIFIER_CHARS, "ledger.get_balance", "é 東京 id"])
def test_identifier_problem__good_value__none(value: str) -> None:
    assert identifier_problem(value) is None
    assert storable_key(value) == value


@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=300))
def test_storable_key__any_text__valid_identifier_and_stable(value: str) -> None:
    key = storable_key(value)
    assert identifier_problem(key) is None
    assert storable_key(value) == key


def test_check_server_context__bad_role__raises_naming_the_field_not_the_value() -> None:
    context = ServerContext(principal="alice", tenant="acme", request_id="r", roles=frozenset({"sk-\x00x"}))
    with pytest.raises(InvalidIdentifier) as raised:
        check_server_context(context)
    assert raised.value.field is IdentifierField.ROLE and "sk-" not in str(raised.value)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        pytest.param("[" * 100_000, "too_deep", id="deep"),
        pytest.param("1" * 5_000, "json_syntax", id="long_integer"),
        pytest.param('{"a": 1, "a": 2}', "duplicate_key", id="duplicate"),
        pytest.param('[{"x": {"a": 1, "a": 1}}]', "duplicate_key", id="nested_duplicate"),
        pytest.param("[NaN]", "json_syntax", id="nan"),
        pytest.param("[1e400]", "non_finite", id="overflow"),
        pytest.param('["\\ud800"]', "not_utf8", id="escaped_surrogate"),
        pytest.param("x" * 101, "too_large", id="large"),
    ],
)
def test_loads_strict__hostile_text__stable_code(text: str, code: str) -> None:
    with pytest.raises(StrictJSONError) as raised:
        loads_strict(text, max_bytes=100 if code == "too_large" else 10**6, max_depth=64)
    assert raised.value.code == code


def test_loads_strict__plain_document__parsed() -> None:
    assert loads_strict(b'{"a": [1, 2.5, "x"]}', max_bytes=100, max_depth=3) == {"a": [1, 2.5, "x"]}
